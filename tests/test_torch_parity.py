"""cek.torch against torch's own loss where the two once parted: what torch's loss takes,
cek.torch takes, and it gives what torch gives.

- Labels of every integer and bool dtype, read as torch reads them: torch compares
  `target == 1` and `target == -1` in the target's dtype, where -1 is 255 in uint8.
- The labels a backward reads: made under torch.inference_mode, or refilled in place between
  forward and backward (a label buffer a data loader reuses).
- Mixed float dtypes: an input changed in place before the backward raises, as in torch.
- Margins as torch takes them (0-d tensors, bools, NumPy scalars, NaN, the infinities), what it
  refuses refused with its exception type; reduction="elementwise_mean" with torch's warning.
- torch.compile(fullgraph=True) with a margin that changes from call to call, and several
  loss heads in one compiled function.

On CPU tensors, and on the CUDA path through the CuPy stand-in (tests/fake_cupy.py) where that
path differs: the eager autograd.Function (fused kernel, then keep kernel) and the custom ops.
"""

import fractions
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402
from oracle import TORCH_TOLERANCES  # noqa: E402
from test_gpu_glue import standin  # noqa: E402,F401  (the fixture `cuda` needs it)
from test_torch_cuda_glue import CudaLike, cuda  # noqa: E402,F401

F = torch.nn.functional
REDUCTIONS = ["none", "mean", "sum"]
TARGET = [1, -1, 0, 2, 1, -1, -1, 1]  # labels 0 and 2: no loss, no gradient
# (rtol, atol) per dtype of the computation, for losses and gradients alike.
TOLERANCES = {getattr(torch, name): tol for name, tol in TORCH_TOLERANCES.items()}
# The paths a step can take: cek's CPU path (float64 here), and on tensors that claim CUDA
# (float32, the kernels run by the emulator) the eager autograd.Function or the custom ops.
PATHS = ["cpu", pytest.param("cuda eager", marks=pytest.mark.emulator),
         pytest.param("cuda op", marks=pytest.mark.emulator)]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    if request.param != "cpu":
        request.getfixturevalue("cuda")
        if request.param == "cuda eager":  # the eager route takes only plain tensors
            monkeypatch.setattr(ct, "_PLAIN", (*ct._PLAIN, CudaLike))
    return request.param


def _dtype(path):
    return torch.float64 if path == "cpu" else torch.float32


def _inputs(n=8, d=9, seed=0):
    """float64 rows whose cosines are mostly above the margins used here, so that rows of label
    -1 have a loss and a gradient."""
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x1, x1 + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)


def _on(path, tensor):
    """`tensor` as the path takes it: plain on the CPU, claiming CUDA on the others."""
    return tensor if path == "cpu" else tensor.as_subclass(CudaLike)


def _leaf(path, x, dtype):
    return _on(path, x.detach().to(dtype).clone()).requires_grad_()


def _weights(loss):
    """An upstream gradient that is not 1 (which the eager CUDA step keeps from its forward)."""
    return torch.linspace(0.5, 2.0, loss.numel(), dtype=loss.dtype).reshape(loss.shape)


def _step(loss_fn, path, x1, x2, target, *args, dtype=None, between=None, **kwargs):
    """(loss, dx1, dx2) of a forward and a backward on new leaves of `dtype` (the path's own by
    default); `between()` runs between the two."""
    a1, a2 = (_leaf(path, x, dtype or _dtype(path)) for x in (x1, x2))
    loss = loss_fn(a1, a2, target, *args, **kwargs)
    if between is not None:
        between()
    (loss * _weights(loss)).sum().backward()
    return [t.detach().as_subclass(torch.Tensor) for t in (loss, a1.grad, a2.grad)]


def _torchs(x1, x2, target, *args, dtype=torch.float64, between=None, **kwargs):
    """_step of torch's loss on plain CPU tensors."""
    return _step(F.cosine_embedding_loss, "cpu", x1, x2, target, *args, dtype=dtype,
                 between=between, **kwargs)


def _close(ours, theirs, dtype):
    rtol, atol = TOLERANCES[dtype]
    for got, want in zip(ours, theirs):
        assert got.shape == want.shape
        torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol,
                                   equal_nan=True)


# -- labels: torch's comparison in the target's dtype ------------------------------------------

LABEL_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
                torch.uint16, torch.uint32, torch.uint64]
# As stored in each dtype: -1 is 255 in uint8 (and the largest value of every unsigned type),
# 255 is -1 in int8, and every non-zero value is True.
LABEL_VALUES = [1, -1, 0, 2, -2, 255, 1, -1]


@pytest.mark.parametrize("dtype", LABEL_DTYPES, ids=str)
def test_integer_and_bool_labels_as_torch_compares_them(dtype):
    """A uint8 label of 255 is a negative pair in torch's loss (`target == -1` in uint8): it
    has a loss and a gradient, which cek gave as 0 (torch.tensor([1, -1]).to(torch.uint8):
    mean 0.6389 where torch gives 0.9080)."""
    x1, x2 = _inputs()
    target = torch.tensor(LABEL_VALUES).to(dtype)
    for reduction in REDUCTIONS:
        theirs = _torchs(x1, x2, target, 0.1, reduction=reduction)
        _close(_step(ct.cosine_embedding_loss, "cpu", x1, x2, target, 0.1,
                     reduction=reduction), theirs, torch.float64)
    rows = _torchs(x1, x2, target, 0.1, reduction="none")[0]
    assert (rows[target == -1] > 0).all()  # the rows torch takes as -1 have a loss here


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128], ids=str)
def test_complex_labels_as_torch_compares_them(dtype):
    """torch compares complex labels too (cek refused them): only 1 and -1 with no imaginary
    part are labels."""
    x1, x2 = _inputs()
    target = torch.tensor([1, -1, 1j, 1 + 1e-12j, -1 + 1j, 0, 2, -1], dtype=dtype)
    for reduction in REDUCTIONS:
        _close(_step(ct.cosine_embedding_loss, "cpu", x1, x2, target, 0.1, reduction=reduction),
               _torchs(x1, x2, target, 0.1, reduction=reduction), torch.float64)


@pytest.mark.emulator
@pytest.mark.parametrize("route", ["cuda eager", "cuda op"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.bool, torch.int64], ids=str)
def test_integer_and_bool_labels_on_the_cuda_path(cuda, monkeypatch, route, dtype):
    if route == "cuda eager":
        monkeypatch.setattr(ct, "_PLAIN", (*ct._PLAIN, CudaLike))
    x1, x2 = _inputs()
    target = torch.tensor(LABEL_VALUES).to(dtype)
    for reduction in REDUCTIONS:
        ours = _step(ct.cosine_embedding_loss, route, x1, x2, _on(route, target), 0.1,
                     reduction=reduction)
        theirs = _torchs(x1.float(), x2.float(), target, 0.1, reduction=reduction)
        _close(ours, theirs, torch.float32)
    assert any("fused" in i for i in cuda.ids()) == (route == "cuda eager")


# -- the labels the backward reads -------------------------------------------------------------

REFILL = [-1, 1, 1, -1, 0, 0, 1, 1]  # the next batch's labels in the same buffer


@pytest.mark.parametrize("label_dtype", [torch.float32, torch.float64, torch.int64,
                                         torch.uint8], ids=str)
def test_labels_made_under_inference_mode(path, label_dtype):
    """Labels a data pipeline made under torch.inference_mode: torch's loss trains with them;
    cek raised "Inference tensors cannot be saved for backward"."""
    with torch.inference_mode():
        target = torch.tensor(TARGET).to(label_dtype)
    x1, x2 = _inputs(seed=1)
    for reduction in REDUCTIONS:
        ours = _step(ct.cosine_embedding_loss, path, x1, x2, _on(path, target), 0.2,
                     reduction=reduction)
        theirs = _torchs(x1.to(_dtype(path)), x2.to(_dtype(path)), target, 0.2,
                         reduction=reduction)
        _close(ours, theirs, _dtype(path))


@pytest.mark.parametrize("label_dtype", [torch.float32, torch.float64, torch.int64,
                                         torch.uint8], ids=str)
def test_labels_refilled_in_place_before_the_backward(path, label_dtype):
    """A label buffer refilled with the next batch between forward and backward: torch's
    backward uses the labels of its forward (it saves its comparisons, not the target); cek
    raised "modified by an inplace operation" (and must not read the new labels either)."""
    x1, x2 = _inputs(seed=2)
    refill = torch.tensor(REFILL).to(label_dtype)
    for reduction in REDUCTIONS:
        buffers = [torch.tensor(TARGET).to(label_dtype) for _ in range(2)]
        ours = _step(ct.cosine_embedding_loss, path, x1, x2, _on(path, buffers[0]), 0.2,
                     reduction=reduction, between=lambda: buffers[0].copy_(refill))
        theirs = _torchs(x1.to(_dtype(path)), x2.to(_dtype(path)), buffers[1], 0.2,
                         reduction=reduction, between=lambda: buffers[1].copy_(refill))
        _close(ours, theirs, _dtype(path))


def test_compiled_step_with_refilled_and_inference_labels():
    """The same two cases through torch.compile (AOTAutograd's saved tensors)."""
    torch._dynamo.reset()
    x1, x2 = _inputs(seed=3)
    results = []
    for loss_fn in (ct.cosine_embedding_loss, F.cosine_embedding_loss):
        step = torch.compile(lambda a, b, t, fn=loss_fn: fn(a, b, t, 0.2), fullgraph=True,
                             backend="aot_eager")
        buffer = torch.tensor(TARGET, dtype=torch.float64)
        with torch.inference_mode():
            made = torch.tensor(TARGET)
        results.append(
            _step(step, "cpu", x1, x2, buffer, between=lambda b=buffer: b.fill_(1))
            + _step(step, "cpu", x1, x2, made))
    _close(*results, torch.float64)


# -- mixed float dtypes ------------------------------------------------------------------------

MIXED = [(torch.float32, torch.float64), (torch.float64, torch.float32),
         (torch.float16, torch.float32), (torch.bfloat16, torch.float16)]


@pytest.mark.parametrize("dtypes", MIXED, ids=lambda d: f"{d[0]}-{d[1]}")
def test_mixed_dtypes_changed_in_place_raise_as_in_torch(path, dtypes):
    """x1 and x2 of two float dtypes, one changed in place after the forward: torch's backward
    raises (its products saved the caller's tensors); cek's silently used the converted copy
    it had made before its op."""
    x1, x2 = _inputs(seed=4)
    for which in (0, 1):
        for loss_fn, on in ((F.cosine_embedding_loss, "cpu"), (ct.cosine_embedding_loss, path)):
            leaves = [_leaf(on, x, dtype) for x, dtype in zip((x1, x2), dtypes)]
            loss = loss_fn(*leaves, _on(on, torch.tensor(TARGET)), 0.1)
            with torch.no_grad():
                leaves[which].mul_(2)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                loss.backward()


@pytest.mark.parametrize("dtypes", MIXED, ids=lambda d: f"{d[0]}-{d[1]}")
def test_mixed_dtypes_give_torchs_loss_and_gradients(path, dtypes):
    """Converted inside cek's ops: the loss in the common dtype, each gradient in its own
    input's dtype, torch's values (torch computed in float64 from the same rounded inputs)."""
    x1, x2 = _inputs(seed=5)
    target = torch.tensor(TARGET)
    x1, x2 = x1.to(dtypes[0]), x2.to(dtypes[1])
    common = torch.promote_types(*dtypes)
    for reduction in REDUCTIONS:
        a1, a2 = _leaf(path, x1, dtypes[0]), _leaf(path, x2, dtypes[1])
        loss = ct.cosine_embedding_loss(a1, a2, _on(path, target), 0.1, reduction=reduction)
        assert loss.dtype == F.cosine_embedding_loss(x1, x2, target).dtype == common
        (loss * _weights(loss)).sum().backward()
        assert (a1.grad.dtype, a2.grad.dtype) == dtypes
        theirs = _torchs(x1, x2, target, 0.1, reduction=reduction)
        ours = [t.detach().as_subclass(torch.Tensor) for t in (loss, a1.grad, a2.grad)]
        tol = torch.float32 if common.itemsize == 8 and path != "cpu" else common
        _close(ours[:1], theirs[:1], tol)
        for got, want, dtype in zip(ours[1:], theirs[1:], dtypes):  # each in its own dtype
            _close([got], [want], torch.float32 if dtype.itemsize == 8 and path != "cpu"
                   else dtype)


def test_opcheck_mixed_dtypes():
    """The ops take x1 and x2 of two dtypes: their fakes give the real ops' dtypes."""
    x1, x2 = _inputs(seed=6)
    target = torch.tensor(TARGET, dtype=torch.float32)
    for d1, d2 in MIXED:
        a1, a2 = x1.to(d1), x2.to(d2)
        torch.library.opcheck(torch.ops.cek.cosine_embedding_loss.default,
                              (a1, a2, target, 0.1, "none"))
        grad = torch.tensor(1.5, dtype=torch.promote_types(d1, d2))
        torch.library.opcheck(torch.ops.cek.cosine_embedding_loss_backward.default,
                              (grad, a1, a2, target, 0.1, "mean"))


# -- margins and reductions --------------------------------------------------------------------

MARGINS_TAKEN = [0.5, -1, True, False, math.nan, math.inf, -math.inf, np.float32(0.25),
                 np.float16(-0.5), np.int64(-1), np.bool_(True), torch.tensor(0.5),
                 torch.tensor(-1), torch.tensor(True), torch.tensor(0.25, dtype=torch.float64),
                 torch.tensor(math.nan), torch.tensor(-math.inf)]
MARGINS_REFUSED = ["0.5", None, 0.5 + 0j, fractions.Fraction(1, 2), 2 ** 2000,
                   torch.tensor([0.5]), torch.tensor(0.5, requires_grad=True), np.array(0.5),
                   torch.tensor(0.5 + 1j)]


@pytest.mark.parametrize("margin", MARGINS_TAKEN, ids=repr)
def test_margins_torch_takes(path, margin):
    """cek refused a 0-d tensor, True, NaN and +-inf (torch computes with them: a NaN margin
    gives NaN for the rows of label -1; +inf no loss; -inf an infinite one)."""
    x1, x2 = _inputs(seed=7)
    target = torch.tensor(TARGET)
    for reduction in REDUCTIONS:
        theirs = _torchs(x1.to(_dtype(path)), x2.to(_dtype(path)), target, margin,
                         reduction=reduction)
        ours = _step(ct.cosine_embedding_loss, path, x1, x2, _on(path, target), margin,
                     reduction=reduction)
        _close(ours, theirs, _dtype(path))
        module = _step(ct.CosineEmbeddingLoss(margin, reduction=reduction), path, x1, x2,
                       _on(path, target))
        _close(module, theirs, _dtype(path))


@pytest.mark.parametrize("margin", MARGINS_REFUSED, ids=repr)
def test_margins_torch_refuses(margin):
    """The exception type torch raises (at the call; cek's module raises at construction)."""
    x1, x2 = (x.float() for x in _inputs())
    target = torch.tensor(TARGET)
    with pytest.raises(Exception) as theirs:
        F.cosine_embedding_loss(x1, x2, target, margin)
    with pytest.raises(theirs.type):
        ct.cosine_embedding_loss(x1, x2, target, margin)
    with pytest.raises(theirs.type):
        ct.CosineEmbeddingLoss(margin)(x1, x2, target)


def test_elementwise_mean_as_torch():
    """torch's old name for "mean", taken with torch's warning (cek raised a ValueError)."""
    x1, x2 = _inputs(seed=8)
    target = torch.tensor(TARGET)
    results, caught = [], []
    for fn in (F.cosine_embedding_loss, ct.cosine_embedding_loss,
               torch.nn.CosineEmbeddingLoss(reduction="elementwise_mean"),
               ct.CosineEmbeddingLoss(reduction="elementwise_mean")):
        kwargs = {"reduction": "elementwise_mean"} if not isinstance(fn, torch.nn.Module) else {}
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            results.append(_step(fn, "cpu", x1, x2, target, **kwargs))
        caught.append([(w.category, str(w.message)) for w in seen])
    assert caught[0] and all(c == caught[0] for c in caught), caught
    for ours in results[1:]:
        _close(ours, results[0], torch.float64)
    _close(results[0], _torchs(x1, x2, target, reduction="mean"), torch.float64)
    assert ct.CosineEmbeddingLoss(reduction="elementwise_mean").reduction == "elementwise_mean"


# -- torch.compile: a margin that changes ------------------------------------------------------


def _compiled_margins(loss_fn, module_class, how, dynamic):
    """Five calls of one compiled function (fullgraph=True), each with another margin, given
    `how`: as an argument, as a schedule setting a module's margin, or as a new module per
    call. (the losses, the frames dynamo compiled)."""
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    module = module_class(margin=0.0)
    steps = {
        "argument": lambda a, b, t, m: loss_fn(a, b, t, m),
        "schedule": lambda a, b, t, m: module(a, b, t),
        "module per call": lambda a, b, t, m: m(a, b, t),
    }
    step = torch.compile(steps[how], fullgraph=True, dynamic=dynamic, backend=counter)
    x1, x2 = _inputs(seed=9)
    target = torch.tensor(TARGET)
    losses = []
    for margin in (0.1, 0.2, -0.3, 0.5, 0.25):
        if how == "schedule":
            module.margin = margin
        arg = module_class(margin=margin) if how == "module per call" else margin
        losses.append(_step(step, "cpu", x1, x2, target, arg))
    return losses, counter.frame_count


@pytest.mark.parametrize("how", ["argument", "schedule", "module per call"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_compiled_margin_changes_like_torchs(how, dynamic):
    """cek's margin check ran math.isfinite on what dynamo now makes a symbolic float: the
    second margin (or with dynamic=True the first) raised Unsupported under fullgraph=True.
    Now no graph break, torch's values, and no more compiled frames than torch's loss needs."""
    ours, our_frames = _compiled_margins(ct.cosine_embedding_loss, ct.CosineEmbeddingLoss,
                                         how, dynamic)
    theirs, their_frames = _compiled_margins(F.cosine_embedding_loss,
                                             torch.nn.CosineEmbeddingLoss, how, dynamic)
    for got, want in zip(ours, theirs):
        _close(got, want, torch.float64)
    assert our_frames <= their_frames, (our_frames, their_frames)


def test_compiled_loss_heads_of_different_margins():
    """Two loss heads of different margins in one compiled step: one graph."""
    import torch._dynamo.testing

    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    heads = [ct.CosineEmbeddingLoss(margin=0.1), ct.CosineEmbeddingLoss(margin=-0.2,
                                                                         reduction="sum")]
    twins = [torch.nn.CosineEmbeddingLoss(margin=0.1),
             torch.nn.CosineEmbeddingLoss(margin=-0.2, reduction="sum")]
    x1, x2 = _inputs(seed=10)
    target = torch.tensor(TARGET)

    def step(losses):
        return lambda a, b, t: losses[0](a, b, t) + 0.5 * losses[1](b, a, t)

    ours = _step(torch.compile(step(heads), fullgraph=True, backend=counter), "cpu", x1, x2,
                 target)
    _close(ours, _step(step(twins), "cpu", x1, x2, target), torch.float64)
    assert counter.frame_count == 1
