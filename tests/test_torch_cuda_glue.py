"""cek.torch's CUDA ops without a GPU: CPU tensors through cek/torch/_cuda.py, with the CuPy
stand-in and the emulator (tests/fake_cupy.py). It proves which kernel each op launches, on which
stream, into which buffers, and what comes back; what only a driver does is the gpu tier's."""

import contextlib

import numpy as np
import pytest
from test_gpu_glue import (ONE_LAUNCH, N, REDUCTIONS, WIDTHS, _branch_rows,  # noqa: F401
                           _close, _expected, _inputs, standin)

pytestmark = pytest.mark.emulator
torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
# The gpu tier's row kernels of a step, one list for both tiers: a change fails here, without a
# GPU. A mean or a sum adds the reduction of the per-row losses after the forward's kernel.
from test_torch import EAGER_STEP_KERNELS, STEP_KERNELS  # noqa: E402
from test_torch import LAUNCHES_PER_STEP, launches_per_step  # noqa: E402
from cek import cosine_embedding_loss_split as split  # noqa: E402
from cek import dtypes  # noqa: E402
from cek.torch import _cuda  # noqa: E402

STREAM = 0xC0FFEE  # the pointer torch.cuda.current_stream() gives in these tests
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                "f64": torch.float64}
REDUCE = "cosine_embedding_loss_reduce"  # one block of 1024 threads for rows of any width


class _Stream:
    """torch.cuda.current_stream()'s answer, with only what every torch release has: the
    `cuda_stream` pointer (torch.cuda.Stream gained `__cuda_stream__` only recently)."""

    cuda_stream = STREAM


@pytest.fixture
def cuda(standin, monkeypatch):  # noqa: F811
    """The stand-in, torch's current stream, and no launch signature checked yet: each test's
    first launch of a signature goes through every check (and DLPack), the later ones pass
    pointers."""
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    # torch's CPU build has no CUDA graphs to ask about: nothing is being captured
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(_cuda, "_plans", {})
    return standin


def _torch_inputs(n, d, dtype, seed, margin=0.1):
    """x1, x2 of `dtype` and float64 labels whose rows take each branch of the loss at
    `margin` (test_gpu_glue.BRANCH_ROWS; at D = 1, where every cosine is +-1, random rows)."""
    x1, x2, y = _inputs(n, d, np.float64, seed)
    if d > 1:
        x1, x2, y = _branch_rows(x1, margin, np.random.default_rng(seed))
    dt = TORCH_DTYPES[dtype]
    return torch.from_numpy(x1).to(dt), torch.from_numpy(x2).to(dt), torch.from_numpy(y)


def _bits(tensor):
    """The memory of a CPU tensor as NumPy (bfloat16 as its int16 bits)."""
    return tensor.view(torch.int16).numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()


SPLIT_SUMS, SPLIT_FORWARD, SPLIT_BACKWARD, SPLIT_FUSED = (
    f"cosine_embedding_loss_split_{k}" for k in ("sums", "forward", "backward", "fused"))


def _with_reduction(kernels, reduction, n=N, dtype="f32"):
    """A step's kernels by name: for a mean or a sum, the reduction follows the forward's, in
    one launch up to ONE_LAUNCH rows, in two (the partials, then their sum) above."""
    if reduction == "none":
        return kernels
    return [kernels[0], *[REDUCE] * (1 if n <= ONE_LAUNCH[dtype] else 2), *kernels[1:]]


def _address(array):
    return array.__array_interface__["data"][0]


def _assert_rows(rows, n, dtype):
    """The row kernel's launch `rows` wrote each row's loss into an [n] buffer of its own, in
    the accumulation dtype (fused: `loss`, forward rows: `out`)."""
    written = rows.args["loss" if "loss" in rows.args else "out"]
    assert written is not None and written.shape == (n,)
    assert written.dtype == dtypes.get(dtype).acc
    return written


def _assert_reduce(rows, reduce, loss, dtype, reduction, n):
    """`reduce`, the launch after the row kernel's `rows`, read the very per-row losses that
    one wrote and wrote the loss handed back (a 0-d tensor of the inputs' dtype, not a copy),
    scaled by 1/n for the mean and 1 for the sum, on torch's current stream."""
    written = _assert_rows(rows, n, dtype)
    assert reduce.kernel_id == f"{REDUCE}__{dtype}__1024"
    assert reduce.stream == STREAM and reduce.device == 0
    read = reduce.args["loss"]
    assert _address(read) == _address(written) and read.shape == written.shape
    assert read.dtype == written.dtype and reduce.args["n_rows"] == n
    acc = dtypes.get(dtype).acc.type
    scale = reduce.args["scale"]
    assert type(scale) is acc and scale == acc(1 / n if reduction == "mean" else 1.0)
    assert loss.dtype == TORCH_DTYPES[dtype] and loss.shape == ()
    assert np.shares_memory(reduce.args["reduced"], _bits(loss.detach()))


@contextlib.contextmanager
def _device_only(cuda):
    """No host read of a tensor (on a GPU a sync every step, and a failed CUDA-graph capture),
    no stream synchronization and no CuPy allocation (a buffer outside torch's allocator, which
    a graph does not own) while the ops run."""

    def refuse(name):
        def refused(*args, **kwargs):
            raise AssertionError(f"{name} inside an op")
        return refused

    synchronizations = cuda.synchronizations
    with pytest.MonkeyPatch.context() as patch:
        for name in ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__",
                     "__array__"):
            patch.setattr(torch.Tensor, name, refuse(f"Tensor.{name}"))
        patch.setattr(torch, "equal", refuse("torch.equal"))
        for name in ("empty", "empty_like", "zeros", "ones", "full", "ascontiguousarray",
                     "asarray"):
            patch.setattr(cuda.cupy, name, refuse(f"cupy.{name}"))
        yield
    assert cuda.synchronizations == synchronizations


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_forward_and_backward_ops(cuda, dtype, reduction, batched):
    x1, x2, y = _torch_inputs(N, 33, dtype, seed=6)
    if not batched:
        x1, x2, y = x1[1], x2[1], y[1]
    with _device_only(cuda):
        loss = _cuda.forward(x1, x2, y, 0.1, reduction)
    n = N if batched else 1
    launch, *reduce = cuda.launches
    assert launch.kernel_id == f"cosine_embedding_loss_forward_rows__{dtype}__64"
    assert launch.stream == STREAM  # launched on torch's current stream
    assert launch.args["x1"].dtype == (np.uint16 if dtype == "bf16" else _bits(x1).dtype)
    assert np.shares_memory(launch.args["x1"], _bits(x1))  # no copy of a contiguous input
    # each row's loss is written; a mean or a sum is the second launch's, over those rows
    if reduction == "none":
        assert reduce == []
        rows = _assert_rows(launch, n, dtype)
        assert loss.shape == x1.shape[:-1]
        if dtype in ("f32", "f64"):  # in the inputs' dtype: the very buffer, not a copy
            assert np.shares_memory(rows, _bits(loss))
    else:
        (reduce,) = reduce
        _assert_reduce(launch, reduce, loss, dtype, reduction, n)

    f1, f2 = (t.double().reshape(-1, 33).numpy() for t in (x1, x2))  # the rounded inputs
    fy = y.double().reshape(-1).numpy()
    a1, a2 = (torch.from_numpy(f.copy()).reshape(x1.shape).requires_grad_() for f in (f1, f2))
    want = torch.nn.functional.cosine_embedding_loss(a1, a2, y.double(), 0.1, reduction=reduction)
    assert loss.dtype == x1.dtype and loss.shape == want.shape
    _close(loss.double(), want.detach(), dtype, "loss")

    # The backward kernel for grad_output 1 and for any other (per row for "none").
    w3 = (torch.linspace(0.5, 2.0, N, dtype=torch.float64)[:want.numel()].reshape(want.shape)
          if reduction == "none" else torch.tensor(3.0, dtype=torch.float64))
    for w in (torch.ones_like(want), w3):
        cuda.launches.clear()
        grad = w.to(x1.dtype)
        with _device_only(cuda):
            dx1, dx2 = _cuda.backward(grad, x1, x2, y, 0.1, reduction)
        (launch,) = cuda.launches
        assert launch.kernel_id == f"cosine_embedding_loss_backward_rows__{dtype}__64"
        assert launch.stream == STREAM
        assert np.shares_memory(launch.args["dx1"], _bits(dx1))  # torch's buffers, written
        _, sizes = _expected(f1, f2, fy, 0.1, reduction, w.numpy())
        refs = torch.autograd.grad(want, (a1, a2), w, retain_graph=True)
        for got, ref, size in zip((dx1, dx2), refs, sizes):
            assert got.dtype == x1.dtype and got.shape == x1.shape
            _close(got.double(), ref, dtype, "grad", size)


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("d", [256, 768, 65536])
def test_row_widths(cuda, d, dtype):
    x1, x2, y = _torch_inputs(3, d, dtype, seed=d, margin=-0.25)
    loss = _cuda.forward(x1, x2, y, -0.25, "mean")
    dx1, dx2 = _cuda.backward(torch.tensor(1.0, dtype=x1.dtype), x1, x2, y, -0.25, "mean")
    width = WIDTHS[d] if d <= 256 else None  # wider rows: the kernel's own BLOCK_SIZE rule
    # three streamed rows: the split's pairs, the partial sums first (of 65536: three rows of
    # 32768 split in float32 alone since cek/split_model.py counts the split's instruction issue)
    if d == 65536:
        sums, forward, reduce, sums_again, backward = cuda.launches
        assert [i.split("__")[0] for i in cuda.ids()] == [SPLIT_SUMS, SPLIT_FORWARD, REDUCE,
                                                          SPLIT_SUMS, SPLIT_BACKWARD]
        assert sums.args["sums"].shape == (3 * split.slices(d, dtype), 4)
        assert np.shares_memory(sums.args["sums"], forward.args["sums"])
    else:
        forward, reduce, backward = cuda.launches
        assert [i.split("__")[0] for i in cuda.ids()] == _with_reduction(STEP_KERNELS, "mean")
    assert width is None or all(i.kernel_id.endswith(f"__{width}") for i in (forward, backward))
    _assert_reduce(forward, reduce, loss, dtype, "mean", 3)  # the same kernel for any width
    f1, f2 = x1.double().numpy(), x2.double().numpy()
    want, size = _expected(f1, f2, y.numpy(), -0.25, "mean", 1.0)
    for g, w, s, kind in zip((loss, dx1, dx2), want, (1.0, *size), ("loss", "grad", "grad")):
        _close(g.double(), w, dtype, kind, s)


def test_negated_views_are_read_as_their_values(cuda):
    """A tensor with torch's negative bit set (torch._neg_view, what conj/neg views give) exports
    its un-negated storage through DLPack: the kernels must see the values, not the storage."""
    x1, x2, y = _torch_inputs(N, 40, "f32", seed=8)
    neg = torch._neg_view(-x1)
    assert neg.is_neg() and torch.equal(neg, x1)
    want, _ = _expected(x1.numpy(), x2.numpy(), y.numpy(), 0.1, "none", 1.0)
    _close(_cuda.forward(neg, x2, y, 0.1, "none"), want[0], "f32", "loss")
    grad = torch._neg_view(-torch.ones(N))
    dx1, _ = _cuda.backward(grad, neg, x2, y, 0.1, "none")
    want_dx1 = _cuda.backward(torch.ones(N), x1, x2, y, 0.1, "none")[0]
    assert torch.equal(dx1, want_dx1)


def test_views_labels_and_no_rows(cuda):
    x1, x2, y = _torch_inputs(N, 40, "f32", seed=7)
    for target in (y, y.to(torch.int64), y.to(torch.bfloat16), y.to(torch.float16)):
        loss = _cuda.forward(x1.t().contiguous().t(), x2, target, 0.1, "none")
        want, _ = _expected(x1.numpy(), x2.numpy(), y.numpy(), 0.1, "none", 1.0)
        _close(loss, want[0], "f32", "loss")
    # float64 labels of 1 + 1e-12 are no label of +-1, as on the CPU path.
    near_one = torch.full((N,), 1 + 1e-12, dtype=torch.float64)
    assert _cuda.forward(x1, x2, near_one, 0.0, "sum").item() == 0.0
    assert not _cuda.backward(torch.tensor(1.0), x1, x2, near_one, 0.0, "sum")[0].any()
    assert cuda.launches[-1].args["y"].dtype == np.float32
    cuda.launches.clear()  # N = 0: no launch; the mean of no rows is NaN, their sum 0
    empty = torch.zeros(0, 5)
    assert torch.isnan(_cuda.forward(empty, empty, torch.zeros(0), 0.0, "mean"))
    assert _cuda.forward(empty, empty, torch.zeros(0), 0.0, "sum").item() == 0.0
    assert _cuda.backward(torch.tensor(1.0), empty, empty, torch.zeros(0), 0.0, "sum")[0].shape \
        == (0, 5)
    assert cuda.launches == []


def _assert_exports_on_torchs_stream(cuda, exported=True):
    """Every DLPack export the kernels read was asked for on torch's current stream, or with no
    stream at all (a capsule). CuPy asks a tensor for the legacy default stream unless a stream
    is entered, and torch then makes that stream wait on its current one: a cross-stream sync
    per tensor, and a failed capture under torch.cuda.graph. `exported`: whether a launch of
    a signature not seen before ran (only those export; the others pass pointers)."""
    assert bool(cuda.dlpack_streams) == exported, cuda.dlpack_streams
    assert set(cuda.dlpack_streams) <= {None, STREAM}, cuda.dlpack_streams
    cuda.dlpack_streams.clear()


class CudaLike(torch.Tensor):
    """A CPU tensor that answers is_cuda: the public API takes its CUDA branch."""

    @property
    def is_cuda(self):
        return True


@pytest.mark.parametrize("route", ["eager", "custom op"])
def test_training_step_through_the_public_api(cuda, monkeypatch, route):
    """Two row kernels per step, for any upstream gradient, and for a mean or a sum the
    reduction of the forward's per-row losses between them, with retain_graph and two backward
    calls accumulating into .grad as torch does; through the eager autograd.Function (the fused
    kernel, then the keep kernel; the second backward runs the backward kernel, so the buffers
    handed out first are never written again) and through the custom ops (what compiled code
    runs). No host read, stream sync or CuPy allocation in any of it."""
    monkeypatch.setattr(ct, "_plain_eager", lambda *tensors: route == "eager")
    x1, x2, y = _torch_inputs(N, 33, "f32", seed=9)
    c1, c2 = (t.clone().as_subclass(CudaLike).requires_grad_() for t in (x1, x2))
    cy = y.as_subclass(CudaLike)
    a1, a2 = (t.double().requires_grad_() for t in (x1, x2))
    # (reduction, the step, the upstream gradient of the mean or sum over both backward calls)
    for reduction, step, total in (("mean", lambda loss: loss, ("mean", 2.0)),
                                   ("none", lambda loss: loss.mean(), ("mean", 2.0)),
                                   ("sum", lambda loss: 3 * loss, ("sum", 6.0))):
        cuda.launches.clear()
        c1.grad = c2.grad = a1.grad = a2.grad = None
        with _device_only(cuda):
            out = ct.cosine_embedding_loss(c1, c2, cy, 0.1, reduction=reduction)
            loss = step(out)
            loss.backward(retain_graph=True)
            loss.backward()  # the second call adds to .grad: nothing handed out may be scaled
        want = step(torch.nn.functional.cosine_embedding_loss(a1, a2, y, 0.1,
                                                              reduction=reduction))
        want.backward(retain_graph=True)
        want.backward()
        kernels = EAGER_STEP_KERNELS if route == "eager" else STEP_KERNELS
        assert ([i.split("__")[0] for i in cuda.ids()]
                == _with_reduction(kernels, reduction) + STEP_KERNELS[1:])
        if reduction == "none":  # the rows handed out; the step's mean is torch's
            _assert_rows(cuda.launches[0], N, "f32")
        else:
            _assert_reduce(*cuda.launches[:2], out, "f32", reduction, N)
        # "sum" launches the signatures "mean" did (each row's loss is always written, and the
        # upstream gradient is one 0-d value): pointers only; "none" gives the backward a dy a
        # row (the gradient of .mean(), read in place), a signature of its own
        _assert_exports_on_torchs_stream(cuda, exported=reduction != "sum")
        _, sizes = _expected(x1.numpy(), x2.numpy(), y.numpy(), 0.1, *total)
        for got, ref, size in zip((c1.grad, c2.grad), (a1.grad, a2.grad), sizes):
            _close(got.detach(), ref, "f32", "grad", size)
    cuda.launches.clear()
    with torch.no_grad(), _device_only(cuda):
        ct.cosine_embedding_loss(c1, c2, cy)
    assert [i.split("__")[0] for i in cuda.ids()] == _with_reduction(STEP_KERNELS[:1], "mean")


def test_eager_route_on_plain_tensors(cuda, monkeypatch):
    """The eager autograd.Function with the CUDA implementations on plain tensors that require
    grad, as a user's CUDA leaves do (a subclass would not show that DLPack refuses them)."""
    from cek.torch import _ops

    monkeypatch.setattr(_ops, "loss", _cuda.forward)
    monkeypatch.setattr(_ops, "backward", _cuda.backward)
    x1, x2, y = _torch_inputs(N, 33, "f32", seed=10)
    a1, a2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    b1, b2 = (t.double().requires_grad_() for t in (x1, x2))
    (2 * ct.cosine_embedding_loss(a1, a2, y, 0.1)).backward()
    (2 * torch.nn.functional.cosine_embedding_loss(b1, b2, y, 0.1)).backward()
    assert [i.split("__")[0] for i in cuda.ids()] == _with_reduction(STEP_KERNELS, "mean")
    _, sizes = _expected(x1.numpy(), x2.numpy(), y.numpy(), 0.1, "mean", 2.0)
    for got, ref, size in zip((a1.grad, a2.grad), (b1.grad, b2.grad), sizes):
        _close(got, ref, "f32", "grad", size)



@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
def test_fused_forward_then_keep_backward(cuda, dtype, reduction):
    """The eager step's kernels: the fused forward's gradients are kept, unread, for the rows
    whose upstream gradient is the one it assumed (a sentinel there survives), the other rows
    are recomputed, in the same buffers, and nothing is read back to the host."""
    x1, x2, y = _torch_inputs(N, 33, dtype, seed=11)
    with _device_only(cuda):
        loss, fused = _cuda.fused_forward(x1, x2, y, 0.1, reduction)
    dx1, dx2, (_, _, labels), sums = fused
    assert sums is None  # 33-wide rows: no split
    launch, *reduce = cuda.launches
    if reduction == "none":  # the rows handed out, written by the kernel in the inputs' dtype
        assert reduce == []
        half = dtype in ("f16", "bf16")
        written = launch.args["loss_out" if half else "loss"]
        assert launch.args["loss" if half else "loss_out"] is None
        assert written.shape == (N,) and np.shares_memory(written, _bits(loss))
    else:
        _assert_reduce(launch, *reduce, loss, dtype, reduction, N)
        assert launch.args["loss_out"] is None
    # the labels' copy the backward reads, written by the kernel as it read them
    assert np.shares_memory(launch.args["y_out"], labels.numpy())
    # float64 labels of float32 rows are mapped to +-1 or 0 first; float64 rows read them as
    # they are (a label not +-1 is then no label, compared exactly)
    read = y.numpy() if dtype == "f64" else np.where(np.abs(y.numpy()) == 1, y.numpy(), 0)
    assert np.array_equal(labels.numpy(), read.astype(labels.numpy().dtype))
    assert launch.kernel_id == f"cosine_embedding_loss_fused__{dtype}__64"
    assert launch.stream == STREAM and launch.args["dy"] is None
    scale = launch.args["scale"]  # in the accumulation dtype
    assert scale == type(scale)(1 / N if reduction == "mean" else 1.0)
    assert np.shares_memory(launch.args["dx1"], _bits(dx1))

    f1, f2, fy = x1.double().numpy(), x2.double().numpy(), y.double().numpy()
    want_loss, _ = _expected(f1, f2, fy, 0.1, reduction, 1.0)
    _close(loss.double(), want_loss[0], dtype, "loss")
    if reduction == "none":  # rows 0, 3, 6, ... keep their gradient of 1
        grad = torch.where(torch.arange(N) % 3 == 0, 1.0, 0.5 + torch.arange(N) / N)
    else:
        grad = torch.tensor(1.0)
    for g in (grad, 2.5 * grad):
        kept = (g == 1).expand(N)
        for t in (dx1, dx2):
            t[kept] = 7.0  # a row kept must not be written
        cuda.launches.clear()
        grad_output = g.to(x1.dtype)
        with _device_only(cuda):
            got = _cuda.keep_backward(grad_output, x1, 0.1, reduction, fused)
        (launch,) = cuda.launches
        assert launch.kernel_id == f"cosine_embedding_loss_backward_keep__{dtype}__64"
        # the gradient as autograd gives it, read in place: one a row for "none", else the 0-d
        # one, with the scale the fused kernel used (a kept row's is 1 itself)
        assert launch.args["dy_stride"] == (1 if reduction == "none" else 0)
        assert np.shares_memory(launch.args["dy"], _bits(grad_output))
        scale = launch.args["scale"]
        assert scale == type(scale)(1 / N if reduction == "mean" else 1.0)
        assert got[0].data_ptr() == dx1.data_ptr() and got[1].data_ptr() == dx2.data_ptr()
        _, sizes = _expected(f1, f2, fy, 0.1, reduction, g.double().numpy())
        want = _expected(f1, f2, fy, 0.1, reduction, g.double().numpy())[0][1:]
        for t, w, size in zip(got, want, sizes):
            assert (t[kept] == 7.0).all()
            _close(t[~kept].double(), w[~kept.numpy()], dtype, "grad", size[~kept.numpy()])


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_split_step_keeps_its_rows_from_the_partials_it_left(cuda, dtype):
    """Three rows of 65536 (streamed, fewer than SPLIT_BELOW_ROWS): the eager step is the split's
    pair, the partial sums into a workspace torch allocates and the fused kernel from them, then
    the reduction; the backward is the split's keep kernel on those very partials (no second
    sums launch), which leaves a row whose upstream gradient is the forward's as it is and
    recomputes the others. Nothing is read back to the host, nothing comes from CuPy's pool."""
    n, d = 3, 65536  # of 32768, bfloat16 runs one block a row (cek/split_model.py)
    x1, x2, y = _torch_inputs(n, d, dtype, seed=12)
    with _device_only(cuda):
        loss, fused = _cuda.fused_forward(x1, x2, y, 0.1, "mean")
    dx1, dx2, _, sums = fused
    first, launch, reduce = cuda.launches
    assert [i.split("__")[0] for i in cuda.ids()] == [SPLIT_SUMS, SPLIT_FUSED, REDUCE]
    assert sums.shape == (n * split.slices(d, dtype), 4) and sums.device == x1.device
    for one in (first, launch):
        assert np.shares_memory(one.args["sums"], sums.numpy()) and one.stream == STREAM
    _assert_reduce(launch, reduce, loss, dtype, "mean", n)
    f1, f2, fy = x1.double().numpy(), x2.double().numpy(), y.double().numpy()
    _close(loss.double(), _expected(f1, f2, fy, 0.1, "mean", 1.0)[0][0], dtype, "loss")
    for g in (1.0, 2.5):
        for t in (dx1, dx2):
            t.fill_(7.0)  # kept (g == 1): must not be written
        cuda.launches.clear()
        with _device_only(cuda):
            got = _cuda.keep_backward(torch.tensor(g, dtype=x1.dtype), x1, 0.1, "mean", fused)
        (back,) = cuda.launches
        assert back.kernel_id == f"{SPLIT_BACKWARD}_keep__{dtype}__1024"
        assert np.shares_memory(back.args["sums"], sums.numpy())
        if g == 1.0:
            assert all((t == 7.0).all() for t in got)
        else:
            want, sizes = _expected(f1, f2, fy, 0.1, "mean", g)
            for t, w, size in zip(got, want[1:], sizes):
                _close(t.double(), w, dtype, "grad", size)


def test_compiled_step_on_cuda_tensors(cuda):
    """torch.compile(fullgraph=True) over the public function on tensors that claim CUDA: the
    code dynamo traces must call nothing it cannot trace (CuPy's device query is such a call,
    in the stand-in as on a GPU), and the compiled step runs the ops' kernels, forward then
    backward, on torch's current stream, with torch's gradients. The graph runs on dynamo's
    "eager" backend: AOTAutograd and inductor do not take a tensor subclass into a custom op
    (the gpu tier compiles with inductor on real CUDA tensors)."""
    torch._dynamo.reset()
    x1, x2, y = _torch_inputs(N, 33, "f32", seed=12)
    c1, c2 = (t.clone().as_subclass(CudaLike).requires_grad_() for t in (x1, x2))
    a1, a2 = (t.double().requires_grad_() for t in (x1, x2))
    step = torch.compile(lambda a, b, t: 2 * ct.cosine_embedding_loss(a, b, t, 0.1),
                         fullgraph=True, backend="eager")
    step(c1, c2, y.as_subclass(CudaLike)).backward()
    (2 * torch.nn.functional.cosine_embedding_loss(a1, a2, y, 0.1)).backward()
    assert [i.split("__")[0] for i in cuda.ids()] == _with_reduction(STEP_KERNELS, "mean")
    assert {launch.stream for launch in cuda.launches} == {STREAM}
    _assert_exports_on_torchs_stream(cuda)
    _, sizes = _expected(x1.numpy(), x2.numpy(), y.numpy(), 0.1, "mean", 2.0)
    for got, ref, size in zip((c1.grad, c2.grad), (a1.grad, a2.grad), sizes):
        _close(got.detach(), ref, "f32", "grad", size)


def test_compiled_steps_of_changing_shapes_trace_the_split_choice(cuda):
    """torch.compile(fullgraph=True, dynamic=True) over shapes one block a row takes and one it
    splits: the choice (cek.cosine_embedding_loss_split.splits) and the check of the sizes are
    made inside the ops, on real sizes, so tracing warns of nothing (an lru_cache once traced
    there made dynamo warn), and each step launches the kernels of its shape."""
    import warnings

    torch._dynamo.reset()
    step = torch.compile(lambda a, b, t: ct.cosine_embedding_loss(a, b, t, 0.1),
                         fullgraph=True, backend="eager", dynamic=True)
    for n, d, first in ((7, 33, "cosine_embedding_loss_forward_rows"),
                        (3, 32768, SPLIT_SUMS)):
        x1, x2, y = _torch_inputs(n, d, "f32", seed=12)
        c1, c2 = (t.clone().as_subclass(CudaLike).requires_grad_() for t in (x1, x2))
        cuda.launches.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            step(c1, c2, y.as_subclass(CudaLike)).backward()
        assert cuda.ids()[0].split("__")[0] == first


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("d", [33, 768])
def test_mean_and_sum_are_the_kernels_own(cuda, monkeypatch, d, dtype, reduction):
    """Both forwards: the row kernel writes each row's loss, then one launch of the reduction
    adds those very rows, and the loss is the tensor it wrote (no torch mean or sum over the
    rows, no cast after it)."""
    reductions = []
    for name in ("mean", "sum"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name, **k: (
            reductions.append((_n, self.numel())), _o(self, *a, **k))[1])
    x1, x2, y = _torch_inputs(N, d, dtype, seed=12)
    f1, f2, fy = x1.double().numpy(), x2.double().numpy(), y.double().numpy()
    want_loss = _expected(f1, f2, fy, 0.1, reduction, 1.0)[0][0]
    for kernel, op in (("forward_rows", _cuda.forward),
                       ("fused", lambda *a: _cuda.fused_forward(*a)[0])):
        cuda.launches.clear()
        with _device_only(cuda):
            loss = op(x1, x2, y, 0.1, reduction)
        rows, reduce = cuda.launches
        assert rows.kernel_id.startswith(f"cosine_embedding_loss_{kernel}__{dtype}__")
        assert reductions == []
        _assert_reduce(rows, reduce, loss, dtype, reduction, N)
        _close(loss.double(), want_loss, dtype, "loss")


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f64"])
def test_a_mean_of_many_rows_is_two_reduction_launches(cuda, dtype):
    """Past ONE_LAUNCH rows the forward's per-row losses are reduced in two launches on torch's
    stream: a block per slice writes partial sums into a workspace torch allocates (no CuPy
    allocation, no host read or sync), then one block adds them with the scale into the loss.
    The second step of the same shapes passes pointers, the grids the first one's checks set,
    and gives the same bits: those of the two levels' order."""
    from test_cosine_embedding_loss_reduce import partials_model, two_level_model

    n = ONE_LAUNCH[dtype] + 5  # three slices, the last of 5 losses
    x1, x2, y = _torch_inputs(n, 4, dtype, seed=14)
    want = _expected(*(t.double().numpy() for t in (x1, x2, y)), 0.1, "mean", 1.0)[0][0]
    bits = []
    for exported in (True, False):
        cuda.launches.clear()
        cuda.dlpack_streams.clear()
        with _device_only(cuda):
            loss = _cuda.forward(x1, x2, y, 0.1, "mean")
        assert bool(cuda.dlpack_streams) == exported
        assert [i.split("__")[0] for i in cuda.ids()] == \
            _with_reduction(STEP_KERNELS[:1], "mean", n, dtype)
        rows, first, second = cuda.launches
        written = _assert_rows(rows, n, dtype)
        partials = first.args["partials"]
        assert _address(first.args["loss"]) == _address(written) and first.args["n_rows"] == n
        assert partials.shape == (3,) and partials.dtype == dtypes.get(dtype).acc
        assert _address(second.args["loss"]) == _address(partials)
        assert second.args["n_rows"] == 3 and second.args["partials"] is None
        assert {first.stream, second.stream} == {STREAM}
        acc = dtypes.get(dtype).acc.type
        assert first.args["scale"] == second.args["scale"] == acc(1 / n)
        assert np.shares_memory(second.args["reduced"], _bits(loss))
        if exported:  # DLPack views keep the op's buffers; a pointer's memory is freed by now
            assert np.asarray(partials).tobytes() == partials_model(written, dtype).tobytes()
            assert _bits(loss).tobytes() == two_level_model(written, 1 / n, dtype).tobytes()
        _close(loss.double(), want, dtype, "loss")
        bits.append(_bits(loss).tobytes())
    assert bits[0] == bits[1]


def test_a_signature_is_checked_in_full_once(cuda):
    """The first launch of a signature (kernel, each tensor's dtype, shape and device) hands the
    kernel DLPack views and runs every check of cek.gpu.launch; the next launch of it passes
    the tensors' pointers, which reach the same memory, with the float scalars of that call.
    A tensor of another dtype or shape (the op called directly) is a new signature, checked in
    full: a clear error before any launch, the output buffer not written."""
    x1, x2, y = _torch_inputs(N, 33, "f32", seed=13)
    first = _cuda.forward(x1, x2, y, 0.1, "none")
    assert cuda.dlpack_streams, "the first launch of a signature exports its tensors"
    cuda.dlpack_streams.clear()
    for margin in (0.1, -0.5):  # the same signature: pointers, with this call's margin
        got = _cuda.forward(x1, x2, y, margin, "none")
        assert cuda.dlpack_streams == []
        want, _ = _expected(x1.numpy(), x2.numpy(), y.numpy(), margin, "none", 1.0)
        _close(got, want[0], "f32", "loss")
    assert torch.equal(first, _cuda.forward(x1, x2, y, 0.1, "none"))
    launch = cuda.launches[-1]
    assert np.shares_memory(launch.args["x1"], x1.numpy()) and launch.stream == STREAM
    # The reduction: checked in full for the mean, then pointers with the sum's scale.
    for reduction, exported in (("mean", True), ("sum", False), ("mean", False)):
        cuda.launches.clear()
        got = _cuda.forward(x1, x2, y, 0.1, reduction)
        assert bool(cuda.dlpack_streams) == exported
        cuda.dlpack_streams.clear()
        _assert_reduce(*cuda.launches, got, "f32", reduction, N)
        want, _ = _expected(x1.numpy(), x2.numpy(), y.numpy(), 0.1, reduction, 1.0)
        _close(got, want[0], "f32", "loss")
    cuda.launches.clear()
    with pytest.raises(TypeError, match="x2 must be float32, got float64"):
        _cuda.forward(x1, x2.double(), y, 0.1, "none")
    with pytest.raises(ValueError, match=r"x2 must have shape \(n_rows, n_dim\) = \(7, 33\)"):
        _cuda.forward(x1, x2[:3], y, 0.1, "none")
    dx = torch.full((N, 33), 7.0)
    with pytest.raises(ValueError, match=r"x1 must have shape \(n_rows, n_dim\) = \(7, 33\)"):
        _cuda.keep_backward(torch.ones(N), x1, 0.1, "none",
                            (dx, dx.clone(), _cuda._rows(x1[:3], x2[:3], y[:3]), None))
    assert cuda.launches == [] and (dx == 7.0).all()


# -- every launch of a training step ------------------------------------------------------------

# aten ops that launch no kernel on a GPU: allocations, and what only reads or changes metadata
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
              "alias", "lift_fresh", "resolve_neg", "resolve_conj", "is_same_size",
              "promote_types"}


class _TorchKernels(TorchDispatchMode):
    """The torch ops run while it is entered that launch a kernel on a GPU: each aten op but
    views and those of _NO_KERNEL (an op seen here is one torch would dispatch to a kernel)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket.__name__ not in _NO_KERNEL:
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# (width, the path cek's launchers take at 3 rows of it: 65536 splits in float32 and bfloat16,
# 32768 in float32 alone, cek/split_model.py)
STEP_PATHS = [(33, "row groups"), (768, "one block a row"), (65536, "split")]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("d, path", STEP_PATHS, ids=[p for _, p in STEP_PATHS])
@pytest.mark.parametrize("reduction, upstream", [("mean", 1.0), ("sum", 1.0), ("sum", 3.0),
                                                 ("none", "per row")])
def test_every_launch_of_a_training_step(cuda, monkeypatch, dtype, d, path, reduction,
                                         upstream):
    """A training step through cek.torch's eager route launches what a hand-written one would:
    the forward, the fused kernel (after the split's partial sums where it splits) and the
    reduction of a mean or a sum; the backward, one keep kernel, which reads the upstream
    gradient as autograd gives it (no expand, multiply or cast launched before) and, where it
    is 1, keeps the fused kernel's gradients. The labels' copy the backward may read is the
    fused kernel's, and "none" hands out rows the kernel wrote in the inputs' dtype. No torch op
    runs but autograd's own seed of loss.backward() (the caller's), here a TorchDispatchMode
    sees every op torch dispatches."""
    monkeypatch.setattr(ct, "_plain_eager", lambda *tensors: True)  # through the mode too
    n = 3
    x1, x2, y = _torch_inputs(n, d, dtype, seed=d)
    y = y.float()  # labels as a float32 target comes: read in place
    c1, c2 = (t.clone().as_subclass(CudaLike).requires_grad_() for t in (x1, x2))
    cy = y.as_subclass(CudaLike)
    dt = TORCH_DTYPES[dtype]
    grad = None if upstream == 1.0 else torch.tensor(3.0, dtype=dt) if upstream == 3.0 else \
        torch.linspace(0.5, 2.0, n, dtype=dt)
    # A step first, as a loop's first step: its launches pass the tensors through DLPack, and
    # the stand-in keeps those views, and with them a reference to dx1 and dx2, which would
    # make autograd copy them into .grad (on a GPU the views are gone when the launch returns).
    ct.cosine_embedding_loss(c1, c2, cy, 0.1, reduction=reduction).backward(grad)
    c1.grad = c2.grad = None
    cuda.launches.clear()
    torch_ops = _TorchKernels()
    with _device_only(cuda), torch_ops:
        out = ct.cosine_embedding_loss(c1, c2, cy, 0.1, reduction=reduction)
        forward = [i.split("__")[0] for i in cuda.ids()]
        forward_ops = list(torch_ops.ops)
        cuda.launches.clear()
        out.backward(grad)
    backward = [i.split("__")[0] for i in cuda.ids()]
    backward_ops = torch_ops.ops[len(forward_ops):]
    split = path == "split"
    fused = SPLIT_FUSED if split else "cosine_embedding_loss_fused"
    assert forward == [SPLIT_SUMS] * split + [fused] + [REDUCE] * (reduction != "none")
    assert backward == [f"{SPLIT_BACKWARD}_keep" if split else "cosine_embedding_loss_backward_keep"]
    assert forward_ops == []
    # autograd's seed of a 0-d loss's backward() without a gradient: torch.ones_like
    assert backward_ops == (["ones_like"] if grad is None else [])
    assert out.dtype == dt and out.shape == (() if reduction != "none" else (n,))
    # the gradients are right, kept or recomputed
    w = 1.0 if grad is None else grad.double().numpy()
    _, sizes = _expected(x1.double().numpy(), x2.double().numpy(), y.numpy(), 0.1, reduction, w)
    a1, a2 = (t.double().requires_grad_() for t in (x1, x2))
    want = torch.nn.functional.cosine_embedding_loss(a1, a2, y.double(), 0.1, reduction=reduction)
    want.backward(None if grad is None else grad.double())
    for got, ref, size in zip((c1.grad, c2.grad), (a1.grad, a2.grad), sizes):
        _close(got.detach().double(), ref, dtype, "grad", size)


_FILLS = {"ones_like", "zeros_like", "full_like", "fill_", "zero_"}  # a fill kernel on a GPU


class _Kernels(_TorchKernels):
    """What CUDA's profiler would see of the steps run while it is entered, in order: cek's
    launches on the stand-in and the torch ops that launch a kernel on a GPU, named as
    tests/test_torch.py's profiled count names them. A launch is a call into the stand-in, not
    an op: the launches made since the last op are taken in before each op."""

    def __init__(self, cuda):
        super().__init__()
        self.cuda = cuda

    def _take_launches(self):
        self.ops += ["cek:" + i.split("__")[0] for i in self.cuda.ids()]
        self.cuda.launches.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._take_launches()
        seen = len(self.ops)
        result = super().__torch_dispatch__(func, types, args, kwargs)
        self.ops[seen:] = ["torch:fill" if op in _FILLS else "torch:" + op
                           for op in self.ops[seen:]]
        return result


def test_the_launches_per_step_of_the_gpu_tier(cuda, monkeypatch):
    """The gpu tier's count of every kernel a step runs (test_torch.py,
    test_cuda_launches_per_step), its very steps, counted here on the stand-in: cek's launches,
    and the torch ops, autograd's among them, that the profiler would see as kernels. A step
    that left .grad set for the next one would add into it here too (add_)."""
    monkeypatch.setattr(ct, "_plain_eager", lambda *tensors: True)  # through the mode too

    def count(step):
        cuda.launches.clear()  # the last step's views hold its gradients: autograd would copy
        with _device_only(cuda), _Kernels(cuda) as kernels:
            step()
            kernels._take_launches()
        return kernels.ops

    assert launches_per_step(lambda t: t.as_subclass(CudaLike), count) == LAUNCHES_PER_STEP


def test_a_first_launch_under_cuda_graph_capture_is_refused_before_anything_runs(cuda,
                                                                                 monkeypatch):
    """The first launch of a kernel compiles and loads it, which CUDA-graph capture forbids:
    cek says so, naming the warm-up, before anything is asked of the device; a kernel loaded
    already takes a new signature (its checks are host work) under capture."""
    from cek import gpu

    x1, x2, y = _torch_inputs(N, 33, "f32", seed=13)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(gpu.CaptureError, match=r"forward_rows.*run the step once before "
                                               r"capturing it \(a warm-up"):
        _cuda.forward(x1, x2, y, 0.1, "none")
    assert cuda.launches == []
    monkeypatch.setattr(gpu, "is_loaded", lambda kernel, device: True)
    _cuda.forward(x1, x2, y, 0.1, "none")
    assert [i.split("__")[0] for i in cuda.ids()] == ["cosine_embedding_loss_forward_rows"]


def test_a_margin_beyond_float32_warns_nothing_on_either_launch(cuda):
    """A finite margin past float32's range is +-inf in the float kernels, as their arithmetic
    would make it; cek's own casts say nothing (a warning is an exception under -W error), on
    the first launch of a signature (every check) and on the next ones (pointers)."""
    import warnings

    x1, x2, y = _torch_inputs(N, 33, "f32", seed=14)
    for margin in (1e39, -1e300, 1e39):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loss = _cuda.forward(x1, x2, y, margin, "none")
        assert cuda.launches[-1].args["margin"] == np.float32(np.sign(margin) * np.inf)
        got, labels = loss.numpy(), y.numpy()
        assert np.isfinite(got[labels == 1]).all()  # 1 - c
        assert (got[labels == -1] == (0 if margin > 0 else np.inf)).all()  # c - margin, or 0
        assert (got[np.abs(labels) != 1] == 0).all()
