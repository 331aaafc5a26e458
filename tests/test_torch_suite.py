"""PyTorch's own test inputs for this loss, run against cek.torch on CPU tensors (and CUDA ones
in the gpu tier). torch.testing._internal needs packages a user does not have (expecttest), so
the inputs are rebuilt here as torch defines them:
- OpInfo `nn.functional.cosine_embedding_loss` (common_methods_invocations.py,
  sample_inputs_cosine_embedding_loss): (S, S) with (S,) and (S,) with (), S = 5, every reduction,
  a random margin in [-1, 1], labels +-1 in the inputs' dtype, the target requiring grad too;
- ModuleInfo `nn.CosineEmbeddingLoss` (common_modules.py): (15, 10) inputs, labels the sign of
  make_tensor's values, the default module, each reduction, margin 0.7;
- test_nn.py's test_cosine_embedding_loss_with_diff_type: every real dtype for input1, input2
  and target (unsigned targets aside) gives the float64 result to 1e-3;
- test_nn.py's error inputs, test_cosine_embedding_loss_error_on_diff_shapes ((0, 0) and (0,)
  inputs, ".*expects 2D.*") and ..._error_on_nonexpandable_shapes ((1, 5) against (1, 6),
  ".*must match the size.*"), with the wrong target and input dimensions ATen's
  cosine_embedding_loss checks (Loss.cpp's messages): torch raises RuntimeError, and so does
  cek (cek.torch.ShapeError, also a ValueError);
- common_nn.py's CosineEmbeddingLoss_no_batch_dim_{none,mean,sum}: (9,) float64 inputs and the
  target 1, against torch's module on the same row batched as (1, 9) (its
  single_batch_reference_criterion_fn), with gradcheck and gradgradcheck as its CriterionTest
  runs them.
"""

import itertools
import random

import pytest

from cek import gpu

torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402
from oracle import TORCH_TOLERANCES  # noqa: E402

F = torch.nn.functional
S = 5
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    gpu.device_count() == 0 or not torch.cuda.is_available(),
    reason="no CUDA device (or a CPU-only torch): gpu tier skipped")])]
# (rtol, atol) per dtype: float64 against torch's float64; float32 against torch's float32.
TOLERANCES = {getattr(torch, name): tol for name, tol in TORCH_TOLERANCES.items()}


def _opinfo_samples(device, dtype, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for shape, reduction in itertools.product(((S, S), (S,)), ("none", "mean", "sum")):
        x1, x2 = (torch.randn(shape, generator=gen, dtype=dtype) * 3 for _ in range(2))
        target = torch.randint(0, 2, shape[:1] if len(shape) == 2 else (), generator=gen) * 2 - 1
        yield (x1.to(device), x2.to(device), target.to(dtype).to(device),
               dict(reduction=reduction, margin=rng.uniform(-1, 1)))


def _module_samples(device, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    for kwargs in ({}, {"reduction": "sum"}, {"reduction": "mean"}, {"reduction": "none"},
                   {"margin": 0.7}):
        x1, x2 = (torch.empty(15, 10, dtype=dtype).uniform_(-9, 9, generator=gen)
                  for _ in range(2))
        target = torch.empty(15, dtype=dtype).uniform_(-9, 9, generator=gen).sign()
        yield x1.to(device), x2.to(device), target.to(device), kwargs


def _compare(x1, x2, target, kwargs, module):
    a1, a2, b1, b2 = (t.clone().requires_grad_() for t in (x1, x2, x1, x2))
    t1, t2 = (target.clone().requires_grad_() for _ in range(2))  # as OpInfo: target too
    if module:
        ours, theirs = ct.CosineEmbeddingLoss(**kwargs)(a1, a2, t1), \
            torch.nn.CosineEmbeddingLoss(**kwargs)(b1, b2, t2)
    else:
        ours, theirs = (ct.cosine_embedding_loss(a1, a2, t1, **kwargs),
                        F.cosine_embedding_loss(b1, b2, t2, **kwargs))
    rtol, atol = TOLERANCES[x1.dtype]
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)
    weights = torch.linspace(0.5, 2.0, ours.numel(), dtype=ours.dtype, device=ours.device)
    (ours.flatten() * weights).sum().backward()
    (theirs.flatten() * weights).sum().backward()
    for got, want in ((a1.grad, b1.grad), (a2.grad, b2.grad)):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1])
def test_opinfo_sample_inputs(device, dtype, seed):
    for x1, x2, target, kwargs in _opinfo_samples(device, dtype, seed):
        _compare(x1, x2, target, kwargs, module=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_module_inputs(device, dtype):
    for x1, x2, target, kwargs in _module_samples(device, dtype, seed=2):
        _compare(x1, x2, target, kwargs, module=True)


REAL_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
               torch.bfloat16, torch.float32, torch.float64]


@pytest.mark.parametrize("device", DEVICES)
def test_with_diff_type(device):
    input1 = torch.tensor([[2, 3, 4], [6, 2, 4]], dtype=torch.double, device=device)
    input2 = torch.tensor([[2, 3, 5], [3, 2, 1]], dtype=torch.double, device=device)
    target = torch.tensor([1, -1], dtype=torch.int, device=device)
    expected = F.cosine_embedding_loss(input1, input2, target)
    for dt1, dt2, dt3 in itertools.product(REAL_DTYPES, REAL_DTYPES, REAL_DTYPES[1:]):
        ours = ct.cosine_embedding_loss(input1.to(dt1), input2.to(dt2), target.to(dt3))
        assert ours.dtype == F.cosine_embedding_loss(input1.to(dt1), input2.to(dt2),
                                                     target.to(dt3)).dtype, (dt1, dt2, dt3)
        assert abs(ours.item() - expected.item()) <= 1e-3, (dt1, dt2, dt3)


# (name, the inputs on a device, the pattern torch's test asks of the message)
ERROR_INPUTS = [
    ("error_on_diff_shapes", lambda device: (
        torch.empty((0, 0), dtype=torch.double, device=device),
        torch.empty((0,), dtype=torch.double, device=device),
        torch.empty((0,), dtype=torch.int, device=device)), ".*expects 2D.*"),
    ("error_on_nonexpandable_shapes", lambda device: (
        torch.empty((1, 5), dtype=torch.double, device=device),
        torch.empty((1, 6), dtype=torch.double, device=device),
        torch.ones((1,), dtype=torch.int, device=device)), ".*must match the size.*"),
    ("2-D target", lambda device: (
        torch.randn(15, 10, device=device), torch.randn(15, 10, device=device),
        torch.randn(15, 1, device=device).sign()), "0D or 1D target tensor expected"),
    ("1-D target, 1-D inputs", lambda device: (
        torch.randn(10, device=device), torch.randn(10, device=device),
        torch.randn(10, device=device)), "1D target tensor expects 2D input tensors"),
    ("0-D target, 2-D inputs", lambda device: (
        torch.randn(2, 5, device=device), torch.randn(2, 5, device=device),
        torch.randn((), device=device)), "0D target tensor expects 1D input tensors"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name, make, pattern", ERROR_INPUTS, ids=[e[0] for e in ERROR_INPUTS])
def test_error_inputs(device, name, make, pattern):
    inputs = make(device)
    with pytest.raises(RuntimeError, match=pattern):  # what torch's test asks of torch
        F.cosine_embedding_loss(*inputs)
    for loss_fn in (ct.cosine_embedding_loss, ct.CosineEmbeddingLoss()):
        with pytest.raises(RuntimeError, match=pattern) as info:
            loss_fn(*inputs)
        assert isinstance(info.value, ct.ShapeError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_no_batch_dim(device, reduction):
    gen = torch.Generator().manual_seed(3)
    x1, x2 = (torch.randn(9, dtype=torch.double, generator=gen).to(device).requires_grad_()
              for _ in range(2))
    target = torch.tensor(1, dtype=torch.double, device=device)
    module = ct.CosineEmbeddingLoss(reduction=reduction)
    ours = module(x1, x2, target)
    batched = torch.nn.CosineEmbeddingLoss(reduction=reduction)(
        x1.unsqueeze(0), x2.unsqueeze(0), target.unsqueeze(0))
    theirs = batched.squeeze(0) if reduction == "none" else batched
    assert ours.shape == theirs.shape == () and ours.dtype == torch.double
    rtol, atol = TOLERANCES[torch.double]
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)
    assert torch.autograd.gradcheck(lambda a, b: module(a, b, target), (x1, x2))
    assert torch.autograd.gradgradcheck(lambda a, b: module(a, b, target), (x1, x2))
