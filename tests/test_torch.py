"""cek.torch: the autograd Function and nn.Module against torch.nn.functional.cosine_embedding_loss
(cpu tier), and the CUDA path (gpu tier, skipped without a device)."""

import math
import re
from pathlib import Path

import numpy as np
import pytest

from cek import gpu, reference
from cek import cosine_embedding_loss_split as split

torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402  (after the importorskip)
from oracle import TORCH_TOLERANCES, TORCH_TWICE_ROUNDED  # noqa: E402

F = torch.nn.functional

# Tolerances per dtype of the computation: {dtype: (rtol, atol)}, for losses and gradients alike.
TOLERANCES = {getattr(torch, name): tol for name, tol in TORCH_TOLERANCES.items()}
TWICE_ROUNDED = {getattr(torch, name): tol for name, tol in TORCH_TWICE_ROUNDED.items()}

MARGINS = [-0.5, 0.0, 0.5]
REDUCTIONS = ["none", "mean", "sum"]
LABELS = (1.0, -1.0, 0.0, 2.0)  # 0 and 2: loss 0, gradient 0
# The kernels one CUDA training step launches (forward, backward), by Kernel.name; the CPU tier
# (tests/test_torch_cuda_glue.py) checks the same list through the CuPy stand-in.
# The kernels of one training step: through the custom ops (what compiled code runs), and in
# eager mode, where the forward runs the fused kernel when gradients will be wanted and the
# backward only corrects the rows whose upstream gradient is not the one it assumed.
STEP_KERNELS = ["cosine_embedding_loss_forward_rows", "cosine_embedding_loss_backward_rows"]
EAGER_STEP_KERNELS = ["cosine_embedding_loss_fused", "cosine_embedding_loss_backward_keep"]


def _inputs(n=8, d=9, dtype=torch.float64, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    x2 = torch.rand(n, 1, generator=g, dtype=torch.float64) * 2 - 1
    x2 = x2 * x1 + torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.tensor([LABELS[i % 4] for i in range(n)], dtype=torch.float64)
    x1, x2 = x1.to(dtype).requires_grad_(requires_grad), x2.to(dtype).requires_grad_(requires_grad)
    return x1, x2, y


def _close(got, want, dtype, table=TOLERANCES):
    rtol, atol = table[dtype]
    np.testing.assert_allclose(
        got.detach().double().numpy(), want.detach().double().numpy(), rtol=rtol, atol=atol)


def _weights(reduction, n):
    """An upstream gradient that is not 1: per-row weights for "none" (multiples of 3/64 for
    n = 33, exact in float16 and bfloat16), 3 otherwise."""
    return torch.linspace(0.5, 2.0, n, dtype=torch.float64) if reduction == "none" else 3.0


# -- gradients against torch, float64 ----------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", MARGINS)
def test_gradcheck(margin, reduction):
    x1, x2, y = _inputs(n=8, d=5, seed=1)

    def loss(a, b, target=y):
        return ct.cosine_embedding_loss(a, b, target, margin, reduction=reduction)

    assert torch.autograd.gradcheck(loss, (x1, x2), eps=1e-6, atol=1e-7, rtol=1e-5)
    for row in range(4):  # (D,) inputs, one per label
        assert torch.autograd.gradcheck(lambda a, b: loss(a[row], b[row], y[row]), (x1, x2))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", MARGINS)
@pytest.mark.parametrize("batched", [True, False])
def test_matches_torch_autograd(margin, reduction, batched):
    x1, x2, y = _inputs(n=12, d=33, seed=2)
    rows = slice(None) if batched else 1
    a1, a2 = x1.detach().clone().requires_grad_(), x2.detach().clone().requires_grad_()
    ours = ct.cosine_embedding_loss(x1[rows], x2[rows], y[rows], margin, reduction=reduction)
    theirs = F.cosine_embedding_loss(a1[rows], a2[rows], y[rows], margin, reduction=reduction)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    _close(ours, theirs, torch.float64)
    w = _weights(reduction, 12)
    w = w[rows] if isinstance(w, torch.Tensor) else w
    (ours * w).sum().backward()
    (theirs * w).sum().backward()
    _close(x1.grad, a1.grad, torch.float64)
    _close(x2.grad, a2.grad, torch.float64)
    if batched:  # labels 0 and 2 (rows 2, 3 of every 4): zero gradient
        assert (x1.grad[2::4] == 0).all() and (x1.grad[3::4] == 0).all()


def test_module_matches_torch_module():
    x1, x2, y = _inputs(seed=3)
    for reduction in REDUCTIONS:
        ours = ct.CosineEmbeddingLoss(margin=0.2, reduction=reduction)
        theirs = torch.nn.CosineEmbeddingLoss(margin=0.2, reduction=reduction)
        _close(ours(x1, x2, y), theirs(x1, x2, y), torch.float64)
    assert "margin=0.2" in repr(ct.CosineEmbeddingLoss(margin=0.2))


@pytest.mark.filterwarnings("ignore:size_average and reduce args will be deprecated")
@pytest.mark.parametrize("size_average, reduce", [(None, False), (False, None), (True, True)])
def test_legacy_size_average_and_reduce(size_average, reduce):
    x1, x2, y = _inputs(seed=4, requires_grad=False)
    ours = ct.cosine_embedding_loss(x1, x2, y, 0.1, size_average, reduce)
    theirs = F.cosine_embedding_loss(x1, x2, y, 0.1, size_average, reduce)
    assert ours.shape == theirs.shape
    _close(ours, theirs, torch.float64)
    module = ct.CosineEmbeddingLoss(0.1, size_average, reduce)
    _close(module(x1, x2, y), theirs, torch.float64)


# -- inside a model: the upstream gradient is not 1 --------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_loss_not_last_in_a_model(reduction):
    torch.manual_seed(5)
    ours_model = torch.nn.Linear(16, 16, dtype=torch.float64)
    theirs_model = torch.nn.Linear(16, 16, dtype=torch.float64)
    theirs_model.load_state_dict(ours_model.state_dict())
    x1, x2, y = _inputs(n=10, d=16, seed=5, requires_grad=False)
    w = _weights(reduction, 10)
    ours = ct.cosine_embedding_loss(ours_model(x1), ours_model(x2), y, 0.0, reduction=reduction)
    theirs = F.cosine_embedding_loss(theirs_model(x1), theirs_model(x2), y, 0.0,
                                     reduction=reduction)
    (ours * w).sum().backward()  # (3 * loss) for mean and sum, per-row weights for none
    (theirs * w).sum().backward()
    _close(ours_model.weight.grad, theirs_model.weight.grad, torch.float64)
    _close(ours_model.bias.grad, theirs_model.bias.grad, torch.float64)


def test_three_times_loss_backward():
    x1, x2, y = _inputs(seed=6)
    (3 * ct.cosine_embedding_loss(x1, x2, y)).backward()
    dx1, dx2 = reference.backward(np.full(8, 3.0 / 8), x1.detach().numpy(), x2.detach().numpy(),
                                  y.numpy())
    _close(x1.grad, torch.from_numpy(dx1), torch.float64)
    _close(x2.grad, torch.from_numpy(dx2), torch.float64)


def test_only_one_input_needs_a_gradient():
    x1, x2, y = _inputs(seed=7)
    x2 = x2.detach()
    ct.cosine_embedding_loss(x1, x2, y).backward()
    assert x1.grad is not None and x2.grad is None


def test_no_grad_keeps_no_graph():
    x1, x2, y = _inputs(seed=8)
    with torch.no_grad():
        loss = ct.cosine_embedding_loss(x1, x2, y)
    assert not loss.requires_grad and loss.grad_fn is None
    _close(loss, F.cosine_embedding_loss(x1, x2, y), torch.float64)


# -- dtypes ------------------------------------------------------------------------------------


def test_autocast_bfloat16_gives_float32_loss():
    torch.manual_seed(9)
    ours_model = torch.nn.Linear(32, 32)
    theirs_model = torch.nn.Linear(32, 32)
    theirs_model.load_state_dict(ours_model.state_dict())
    x1, x2, y = _inputs(n=16, d=32, dtype=torch.float32, seed=9, requires_grad=False)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        e1, e2 = ours_model(x1), ours_model(x2)
        assert e1.dtype == torch.bfloat16
        ours = ct.cosine_embedding_loss(e1, e2, y, 0.1)
        theirs = F.cosine_embedding_loss(theirs_model(x1), theirs_model(x2), y, 0.1)
        mixed = ct.cosine_embedding_loss(e1, x2[:, :32], y, 0.1)  # bfloat16 with float32
    assert ours.dtype == theirs.dtype == torch.float32 and mixed.dtype == torch.float32
    _close(ours, theirs, torch.float32)  # both computed in float32 from the same bf16 values
    ours.backward()
    theirs.backward()
    assert ours_model.weight.grad.dtype == torch.float32
    _close(ours_model.weight.grad, theirs_model.weight.grad, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_cpu_tensors(dtype):
    x1, x2, y = _inputs(n=16, d=769, dtype=dtype, seed=10)
    for reduction in REDUCTIONS:
        a1, a2 = x1.detach().clone().requires_grad_(), x2.detach().clone().requires_grad_()
        loss = ct.cosine_embedding_loss(a1, a2, y.to(dtype), 0.1, reduction=reduction)
        assert loss.dtype == dtype
        loss.sum().backward()
        assert a1.grad.dtype == a2.grad.dtype == dtype
        # The float64 reference on the same rounded inputs.
        r1, r2 = x1.detach().double().numpy(), x2.detach().double().numpy()
        rows = reference.forward(r1, r2, y.numpy(), 0.1)
        want = {"none": rows, "mean": rows.mean(), "sum": rows.sum()}[reduction]
        _close(loss, torch.as_tensor(want), dtype)
        dy = np.full(16, 1.0 / 16 if reduction == "mean" else 1.0)
        dx1, dx2 = reference.backward(dy, r1, r2, y.numpy(), 0.1)
        _close(a1.grad, torch.from_numpy(dx1), dtype)
        _close(a2.grad, torch.from_numpy(dx2), dtype)


def test_bfloat16_cpu_rows_are_read_in_place(monkeypatch):
    """bfloat16 CPU tensors reach the CPU path as their own bits: no float32 copy of x1 or x2
    (NumPy has no bfloat16; a copy would cost 2x the inputs' bytes in the forward and again in
    the backward)."""
    from cek import functional
    from cek.torch import _ops

    seen = []

    def spy(function):
        def wrapped(*args, **kwargs):
            seen.append((function.__name__, args, kwargs))
            return function(*args, **kwargs)
        return wrapped

    for name in ("cosine_embedding_loss", "cosine_embedding_loss_backward"):
        monkeypatch.setattr(_ops.functional, name, spy(getattr(functional, name)))
    x1, x2, y = _inputs(n=16, d=64, dtype=torch.bfloat16, seed=3)
    x1.requires_grad_()
    ct.cosine_embedding_loss(x1, x2, y, 0.1).backward()
    assert [name for name, _, _ in seen] == ["cosine_embedding_loss",
                                             "cosine_embedding_loss_backward"]
    for name, args, kwargs in seen:
        a, b = args[1:3] if name.endswith("backward") else args[:2]
        assert kwargs.get("dtype") == "bfloat16", name
        assert a.ctypes.data == x1.data_ptr() and b.ctypes.data == x2.data_ptr(), name


def test_kernels_md_says_what_eager_torch_gives_in_float16():
    """docs/kernels.md's figures for eager torch on three float16 rows are what the installed
    torch gives (the page said NaN, NaN and -inf; torch 2.13 gives 1.0 for the second, a wrong
    finite value), and cek gives the right losses there."""
    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "kernels.md").read_text()
                    .split())
    match = re.search(r"identical rows of (\d+) zeros, N\(0,1\) values and N\(0,1\) values "
                      r"times (\S+); eager PyTorch on the CPU gives (\S+), (\S+) and (\S+) for "
                      r"the three in float16, the (\S+) a wrong finite value", text)
    assert match, "docs/kernels.md's sentence on eager torch in float16 changed: update this test"
    width, scale = int(match[1]), float(match[2])
    stated = [float(v.replace("−", "-")) for v in match.group(3, 4, 5)]
    normal = torch.randn(1, width, generator=torch.Generator().manual_seed(0),
                         dtype=torch.float64)
    y = torch.ones(1)
    for row, value in zip((torch.zeros(1, width, dtype=torch.float64), normal, normal * scale),
                          stated):
        half = row.half()
        got = F.cosine_embedding_loss(half, half.clone(), y, reduction="none").item()
        assert got == value or (math.isnan(got) and math.isnan(value)), (got, value)
        rounded = half.double().numpy()
        right = reference.forward(rounded, rounded, y.numpy())
        _close(ct.cosine_embedding_loss(half, half.clone(), y, reduction="none"),
               torch.from_numpy(right), torch.float16)
        if value == float(match[6]):  # the wrong finite one
            assert math.isfinite(value) and abs(value - right[0]) > 0.5


@pytest.mark.parametrize("case", ["zero vector", "large rows", "small rows"])
def test_float16_cases_where_eager_torch_fails(case):
    # Eager torch on float16 gives NaN, loss 1 and -inf for these rows: it forms sq1*sq2 in half.
    x = {
        "zero vector": torch.zeros(2, 64, dtype=torch.float16),
        "large rows": torch.full((2, 64), 20.0, dtype=torch.float16),
        "small rows": torch.full((2, 64), 1e-3, dtype=torch.float16),
    }[case]
    x1 = x.clone().requires_grad_()
    x2 = (x + 1 if case == "zero vector" else x.clone()).requires_grad_()
    y = torch.tensor([1.0, -1.0])
    loss = ct.cosine_embedding_loss(x1, x2, y, reduction="none")
    want = reference.forward(x1.detach().double().numpy(), x2.detach().double().numpy(), y.numpy())
    _close(loss, torch.from_numpy(want), torch.float16)
    loss.sum().backward()
    assert torch.isfinite(x2.grad).all()
    if case != "zero vector":  # the zero row's dx1 is ~1e6 in size: past float16's range
        assert torch.isfinite(x1.grad).all()


# -- layout, shapes ----------------------------------------------------------------------------


def test_non_contiguous_tensors():
    x1, x2, y = _inputs(n=8, d=33, seed=11, requires_grad=False)
    t1 = x1.t().contiguous().t().requires_grad_()  # column-major view
    t2 = x2.repeat_interleave(2, dim=1)[:, ::2].detach().requires_grad_()  # strided view
    assert not t1.is_contiguous() and not t2.is_contiguous()
    c1, c2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    for reduction in REDUCTIONS:
        a = ct.cosine_embedding_loss(t1, t2, y, 0.1, reduction=reduction)
        b = ct.cosine_embedding_loss(c1, c2, y, 0.1, reduction=reduction)
        assert torch.equal(a, b)
    a.sum().backward()
    b.sum().backward()
    assert torch.equal(t1.grad, c1.grad) and torch.equal(t2.grad, c2.grad)


def test_zero_rows_like_torch():
    x = torch.zeros(0, 5, dtype=torch.float64, requires_grad=True)
    y = torch.zeros(0, dtype=torch.float64)
    assert torch.isnan(ct.cosine_embedding_loss(x, x, y))
    assert ct.cosine_embedding_loss(x, x, y, reduction="sum") == 0
    ct.cosine_embedding_loss(x, x, y, reduction="sum").backward()
    assert x.grad.shape == (0, 5)


def test_integer_target():
    x1, x2, y = _inputs(seed=12)
    _close(ct.cosine_embedding_loss(x1, x2, y.long()), F.cosine_embedding_loss(x1, x2, y),
           torch.float64)


# -- bad input ---------------------------------------------------------------------------------

N, D = 8, 9


def _good():
    x1, x2, y = _inputs(N, D)
    return {"input1": x1, "input2": x2, "target": y}


# (name, changes to the good arguments, exception, text the message must contain). Shapes the
# loss does not take raise ct.ShapeError, a ValueError and a RuntimeError (what torch raises).
BAD_INPUTS = [
    ("numpy input", {"input1": np.ones((N, D))}, TypeError, "ndarray"),
    ("complex inputs", {"input1": torch.ones(N, D, dtype=torch.complex128)}, TypeError,
     "complex128"),
    ("target device", {"target": torch.ones(N, device="meta")}, TypeError, "meta"),
    ("input2 shape", {"input2": torch.ones(N, D + 1, dtype=torch.float64)}, ct.ShapeError,
     "(8, 10)"),
    ("target shape", {"target": torch.ones(N + 1)}, ct.ShapeError, "(9,)"),
    ("3 dims", {"input1": torch.ones(N, D, 1, dtype=torch.float64),
                "input2": torch.ones(N, D, 1, dtype=torch.float64)}, ct.ShapeError, "3 and 3 dims"),
    ("widths differ", {"input2": torch.ones(N, 1, dtype=torch.float64)}, ct.ShapeError, "(8, 1)"),
    ("rows differ", {"input2": torch.ones(N - 1, D, dtype=torch.float64)}, ct.ShapeError, "(7, 9)"),
    ("2-D target", {"target": torch.ones(N, 1)}, ct.ShapeError, "(8, 1)"),
    ("reduction", {"reduction": "avg"}, ValueError, "'avg'"),
    ("margin string", {"margin": "0.5"}, TypeError, "str"),  # as torch: tests/test_torch_parity.py
    ("margin 1-d tensor", {"margin": torch.tensor([0.5])}, TypeError, "(1,)"),
    ("margin on meta", {"margin": torch.tensor(0.5, device="meta")}, TypeError, "meta"),
]


@pytest.mark.parametrize("name, change, error, text", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input(name, change, error, text):
    with pytest.raises(error) as info:
        ct.cosine_embedding_loss(**{**_good(), **change})
    assert text in str(info.value), str(info.value)


def test_bad_module_arguments():
    with pytest.raises(ValueError, match="'avg'"):
        ct.CosineEmbeddingLoss(reduction="avg")
    with pytest.raises(TypeError, match="NoneType"):  # torch raises at the first call
        ct.CosineEmbeddingLoss(margin=None)


# -- gpu tier: CUDA tensors --------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(
    gpu.device_count() == 0 or not torch.cuda.is_available(),
    reason="no CUDA device (or a CPU-only torch): gpu tier skipped")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cuda_matches_torch(reduction, dtype):
    x1, x2, y = _inputs(n=33, d=769, dtype=dtype, seed=20, requires_grad=False)
    x1, x2, y = x1.cuda().requires_grad_(), x2.cuda().requires_grad_(), y.cuda()
    a1, a2 = x1.detach().double().requires_grad_(), x2.detach().double().requires_grad_()
    ours = ct.cosine_embedding_loss(x1, x2, y, 0.1, reduction=reduction)
    theirs = F.cosine_embedding_loss(a1, a2, y.double(), 0.1, reduction=reduction)
    assert ours.dtype == dtype and ours.shape == theirs.shape
    tol = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32  # runs in float32
    _close(ours.cpu(), theirs.cpu(), tol)
    w = _weights(reduction, 33)
    if isinstance(w, torch.Tensor):
        w = w.cuda()
        (ours * w.to(dtype)).sum().backward()
    else:
        (ours * w).sum().backward()
    (theirs * w).sum().backward()
    assert x1.grad.dtype == dtype
    table = TWICE_ROUNDED if dtype in TWICE_ROUNDED else TOLERANCES
    _close(x1.grad.cpu(), a1.grad.cpu(), tol, table)
    _close(x2.grad.cpu(), a2.grad.cpu(), tol, table)


# Every kernel a step runs on the GPU, cek's and torch's, named as launches_per_step's counts
# name them: cek's by kernel name, torch's fill (autograd's seed of loss.backward(), ones_like)
# as "torch:fill", any other of torch's by its own name. A mean: the fused kernel and the
# reduction, then the seed and the keep kernel; per-row losses ("none") with a per-row gradient:
# the fused kernel and the keep kernel; no_grad: the forward-rows kernel and the reduction.
LAUNCHES_PER_STEP = {
    "mean": ["cek:cosine_embedding_loss_fused", "cek:cosine_embedding_loss_reduce", "torch:fill",
             "cek:cosine_embedding_loss_backward_keep"],
    "none": ["cek:cosine_embedding_loss_fused", "cek:cosine_embedding_loss_backward_keep"],
    "no_grad": ["cek:cosine_embedding_loss_forward_rows", "cek:cosine_embedding_loss_reduce"]}


def launches_per_step(to_device, count) -> dict[str, list[str]]:
    """The kernels of each step of LAUNCHES_PER_STEP, by `count(step)`, which runs the step once
    and names the kernels it ran; each step is run once before (the first step of a signature
    compiles, checks and goes through DLPack; later ones go through the signature's plan).
    Shared by the gpu tier (CUDA's profiler) and its CPU twin (the CuPy stand-in and the torch
    ops dispatched, tests/test_torch_cuda_glue.py), so a mistake here fails both.
    Each step starts as a training loop's does after optimizer.zero_grad() (set_to_none=True,
    its default): no .grad, so autograd hands the gradients over. With the last step's .grad
    still set, it adds into them: one more kernel (add_) for each input. The labels are float32,
    as a float target comes: float64 ones are mapped to exact labels by torch ops on every call
    (cek.torch._labels), kernels of their own."""
    x1, x2, y = _inputs(n=64, d=256, dtype=torch.float32, seed=21, requires_grad=False)
    x1, x2 = to_device(x1).requires_grad_(), to_device(x2).requires_grad_()
    y = to_device(y.float())
    w = to_device(torch.linspace(0.5, 2.0, 64))

    def launches(step):
        def run():
            x1.grad = x2.grad = None
            step()

        run()
        return count(run)

    def forward_only():
        with torch.no_grad():
            ct.cosine_embedding_loss(x1, x2, y)

    return {"mean": launches(lambda: ct.cosine_embedding_loss(x1, x2, y).backward()),
            "none": launches(lambda: ct.cosine_embedding_loss(x1, x2, y, reduction="none")
                             .backward(w)),
            "no_grad": launches(forward_only)}


@pytest.mark.gpu
@needs_cuda
def test_cuda_launches_per_step():
    """Every kernel a step runs, as CUDA's profiler sees them: LAUNCHES_PER_STEP."""
    from torch.profiler import ProfilerActivity, profile

    def profiled(step):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return ["cek:" + n[:-len("_entry_point")] if n.endswith("_entry_point")
                else "torch:fill" if "fill" in n.lower() else "torch:" + n for n in names]

    assert launches_per_step(lambda t: t.cuda(), profiled) == LAUNCHES_PER_STEP


@pytest.mark.gpu
@needs_cuda
def test_cuda_side_stream_autocast_and_views():
    x1, x2, y = _inputs(n=16, d=100, dtype=torch.float32, seed=22, requires_grad=False)
    x1, x2, y = x1.cuda(), x2.cuda(), y.cuda()
    want = F.cosine_embedding_loss(x1, x2, y, 0.1, reduction="none")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # the launch must follow torch's current stream
        got = ct.cosine_embedding_loss(x1.t().contiguous().t(), x2, y, 0.1, reduction="none")
    torch.cuda.current_stream().wait_stream(stream)
    _close(got.cpu(), want.cpu(), torch.float32)
    with torch.autocast(device_type="cuda", dtype=torch.float16):
        loss = ct.cosine_embedding_loss(x1.half(), x2.half(), y)
    assert loss.dtype == torch.float32
    too_long = split.max_n_dim("f32") + 1  # 2**22 + 1: no kernel, split or not
    long_row = torch.ones(1, too_long, device="cuda")
    with pytest.raises(ValueError, match=str(too_long)):
        ct.cosine_embedding_loss(long_row, long_row, torch.ones(1, device="cuda"))
    with pytest.raises(TypeError, match="cuda"):
        ct.cosine_embedding_loss(x1, x2, y.cpu())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("weight", [1.0, 3.0])
def test_cuda_step_without_sync_and_in_a_cuda_graph(weight):
    """No host read in forward or backward (sync debug mode "error"), and a whole step
    (forward, backward, optimizer) captured in a CUDA graph and replayed gives eager's weights,
    for an upstream gradient of 1 (the fused gradients kept) and of 3 (recomputed)."""
    torch.manual_seed(23)
    x1, x2, y = _inputs(n=32, d=64, dtype=torch.float32, seed=23, requires_grad=False)
    x1, x2, y = x1.cuda(), x2.cuda(), y.cuda()
    model = torch.nn.Linear(64, 64).cuda()
    twin = torch.nn.Linear(64, 64).cuda()
    twin.load_state_dict(model.state_dict())
    loss_fn = ct.CosineEmbeddingLoss(margin=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)

    def step(m, o):
        o.zero_grad(set_to_none=False)
        (weight * loss_fn(m(x1), m(x2), y)).backward()
        o.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles the kernels) off the capture
        step(model, opt)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(model, opt)
    step(twin, twin_opt)  # eager: one step for the warm-up...
    torch.cuda.set_sync_debug_mode("error")
    try:
        step(twin, twin_opt)  # ...and one for the captured step, with no sync allowed
        step(twin, twin_opt)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    graph.replay()
    graph.replay()  # warm-up, capture (not run) and two replays: three steps on `model`
    torch.cuda.synchronize()
    for got, want in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@needs_cuda
def test_cuda_opcheck_and_compile():
    x1, x2, y = _inputs(n=16, d=40, dtype=torch.float32, seed=24)
    x1, x2, y = (t.detach().cuda() for t in (x1, x2, y))
    torch.library.opcheck(torch.ops.cek.cosine_embedding_loss.default, (x1, x2, y, 0.1, "none"))
    torch.library.opcheck(torch.ops.cek.cosine_embedding_loss_backward.default,
                          (torch.tensor(2.0, device="cuda"), x1, x2, y, 0.1, "mean"))
    a1, a2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    b1, b2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    fn = torch.compile(ct.cosine_embedding_loss, fullgraph=True)
    fn(a1, a2, y, 0.1).backward()
    ct.cosine_embedding_loss(b1, b2, y, 0.1).backward()
    torch.testing.assert_close(a1.grad, b1.grad)
    torch.testing.assert_close(a2.grad, b2.grad)
