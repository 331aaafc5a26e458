"""The GPU glue without a GPU: cek.functional on CuPy arrays and cek.torch's CUDA helpers, with
NumPy standing in for CuPy and the CPU emulator (the real kernels) standing in for the device
(tests/fake_cupy.py, shared with tests/test_bench.py).

Launches go through cek.gpu.launch and cek.gpu.load themselves; only the compiled function
(cek.gpu.get_function, NVRTC) is replaced by the emulator. So the stand-in proves what the glue
decides: which kernel it launches (name, dtype, BLOCK_SIZE), once, with arguments that pass
cek.gpu's checks, inside the device and stream contexts it sets up, into which buffers, and what
it delivers from them. It cannot prove what only CuPy and a driver do: the real DLPack exchange
and its stream handshake, stream ordering, device memory, CuPy's own reductions and casts. The
gpu tier of tests/test_functional.py and tests/test_torch.py does.
"""

import types

import numpy as np
import pytest
from fake_cupy import DeviceArray, install

from cek import dtypes, gpu
from cek import functional as F
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from oracle import GLUE_TOLERANCES, expected_and_sizes

pytestmark = pytest.mark.emulator

TOLERANCES = GLUE_TOLERANCES  # {kernel dtype: {"loss"|"grad"|"scaled": (rtol, atol)}}

LABELS = (1.0, -1.0, 0.0, 2.0)  # 0 and 2: loss 0, gradient 0
REDUCTIONS = ["none", "mean", "sum"]
N = 7
# Row widths and the path the fused kernel takes for them (for float32; CosineEmbeddingLossFused
# tells for each dtype): D = 1 and 33 and 256 in row groups (<= 64 chunks), 768 in registers,
# 20000 streamed (> 16384 elements).
WIDTHS = {1: 1, 33: 64, 256: 256, 768: 1024, 20000: 32768}  # D: BLOCK_SIZE
CUPY_DTYPES = {"f32": np.float32, "f16": np.float16, "f64": np.float64}


# -- the stand-in (tests/fake_cupy.py) ---------------------------------------------------------


@pytest.fixture
def standin(monkeypatch):
    """The stand-in in place. Launches go through cek.gpu.launch and cek.gpu.load themselves,
    with their checks (kernel.check_args against the fake cupy.ndarray, the device check):
    only get_function, which compiles with NVRTC, is replaced."""
    return install(monkeypatch)


# -- helpers -----------------------------------------------------------------------------------


def _inputs(n, d, dtype, seed=0):
    """x2 a random multiple of x1 plus noise, so cosines spread over (-1, 1); labels cycle
    through LABELS. Float64 values, rounded to `dtype` (a NumPy dtype)."""
    rng = np.random.default_rng(seed)
    x1 = rng.standard_normal((n, d))
    x2 = rng.uniform(-1, 1, (n, 1)) * x1 + rng.standard_normal((n, d))
    y = np.array([LABELS[i % 4] for i in range(n)])
    return x1.astype(dtype), x2.astype(dtype), y.astype(dtype)


_expected = expected_and_sizes


def _close(got, want, dtype, kind, size=1.0):
    rtol, atol = TOLERANCES[dtype][kind]
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    want = want.reshape(got.shape)
    size = np.asarray(size, np.float64)
    size = size.reshape(got.shape) if size.size == got.size else size  # else a number
    floor = dtypes.smallest_step(dtype) if kind != "loss" else 0.0
    bad = ~(np.abs(got - want) <= rtol * np.abs(want) + atol * size + floor)
    assert not bad.any(), (f"{kind}: {int(bad.sum())} of {bad.size} off, first at "
                           f"{np.argwhere(bad)[0]}: got {got[bad][0]!r}, want {want[bad][0]!r}")


def _grad(reduction, n, dtype):
    """An upstream gradient other than 1: per-row weights for "none", else 1.5."""
    if reduction == "none":
        return np.linspace(0.5, 2.0, n).astype(dtype)
    return 1.5


# -- cek.functional on CuPy arrays -------------------------------------------------------------


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", list(CUPY_DTYPES))
def test_cupy_path_matches_reference(standin, dtype, reduction):
    x1, x2, y = _inputs(N, 33, CUPY_DTYPES[dtype], seed=1)
    c1, c2, cy = (standin.array(a) for a in (x1, x2, y))
    grad = _grad(reduction, N, CUPY_DTYPES[dtype])
    cgrad = standin.array(grad) if reduction == "none" else grad
    (loss, dx1, dx2), (m1, m2) = _expected(x1, x2, y, 0.25, reduction, grad)

    def check(results, kernel, want, size):
        assert standin.ids() == [f"cosine_embedding_loss_{kernel}__{dtype}__64"]
        assert standin.launches[0].device == 0  # inside cupy.cuda.Device(x1's device)
        standin.launches.clear()
        for got, w, s, kind in zip(results, want, size, ("loss", "grad", "grad")[-len(want):]):
            assert type(got) is DeviceArray and got.dtype == x1.dtype and got.shape == np.shape(w)
            _close(got, w, dtype, kind, s)

    check([F.cosine_embedding_loss(c1, c2, cy, 0.25, reduction)], "forward_rows", [loss], [1.0])
    check(F.cosine_embedding_loss_backward(cgrad, c1, c2, cy, 0.25, reduction), "backward_rows",
          [dx1, dx2], [m1, m2])
    check(F.cosine_embedding_loss_fused(c1, c2, cy, 0.25, reduction, cgrad), "fused",
          [loss, dx1, dx2], [1.0, m1, m2])
    (_, *ones), (o1, o2) = _expected(x1, x2, y, 0.25, reduction, 1.0)  # grad=None means 1
    check(F.cosine_embedding_loss_fused(c1, c2, cy, 0.25, reduction), "fused",
          [loss, *ones], [1.0, o1, o2])
    if reduction != "none":  # a 0-d device array as grad gives what the number gives
        g0 = standin.array(np.array(grad, CUPY_DTYPES[dtype]))
        check(F.cosine_embedding_loss_backward(g0, c1, c2, cy, 0.25, reduction), "backward_rows",
              [dx1, dx2], [m1, m2])
        check(F.cosine_embedding_loss_fused(c1, c2, cy, 0.25, reduction, g0), "fused",
              [loss, dx1, dx2], [1.0, m1, m2])


@pytest.mark.parametrize("dtype", list(CUPY_DTYPES))
@pytest.mark.parametrize("d", list(WIDTHS))
def test_cupy_row_widths(standin, d, dtype):
    """Every path of the fused kernel: row groups, registers, streamed rows."""
    n = 3 if d > 1000 else N
    x1, x2, y = _inputs(n, d, CUPY_DTYPES[dtype], seed=d)
    got = F.cosine_embedding_loss_fused(*(standin.array(a) for a in (x1, x2, y)), -0.25, "sum")
    kernel = CosineEmbeddingLossFused.for_n_dim(d, dtype)
    assert standin.ids() == [f"cosine_embedding_loss_fused__{dtype}__{WIDTHS[d]}"]
    if dtype == "f32":
        assert (kernel.grouped, kernel.streamed) == (d <= 256, d > 16384)
    want, size = _expected(x1, x2, y, -0.25, "sum", 1.0)
    for g, w, s, kind in zip(got, want, (1.0, *size), ("loss", "grad", "grad")):
        _close(g, w, dtype, kind, s)


@pytest.mark.parametrize("dtype", list(CUPY_DTYPES))
def test_cupy_out_buffers(standin, dtype):
    """Buffers of the kernel's dtype are written by the kernel itself; others (float16's loss,
    which the kernel gives in float32; buffers overlapping an input) through a copy."""
    np_dtype = CUPY_DTYPES[dtype]
    x1, x2, y = _inputs(N, 40, np_dtype, seed=2)
    c1, c2, cy = (standin.array(a) for a in (x1, x2, y))
    (loss, dx1, dx2), (m1, m2) = _expected(x1, x2, y, 0.0, "none", 1.0)
    out = tuple(standin.array(np.full(shape, np.nan, np_dtype))
                for shape in ((N,), x1.shape, x1.shape))
    got = F.cosine_embedding_loss_fused(c1, c2, cy, 0.0, "none", out=out)
    assert all(a is b for a, b in zip(got, out))
    for g, w, s, kind in zip(out, (loss, dx1, dx2), (1.0, m1, m2), ("loss", "grad", "grad")):
        _close(g, w, dtype, kind, s)
    (launch,) = standin.launches
    direct = {name: np.shares_memory(launch.args[name], buffer)
              for name, buffer in zip(("loss", "dx1", "dx2"), out)}
    assert direct == {"loss": dtype != "f16", "dx1": True, "dx2": True}

    standin.launches.clear()
    single = standin.array(np.full(N, np.nan, np_dtype))
    assert F.cosine_embedding_loss(c1, c2, cy, 0.0, "none", out=single) is single
    _close(single, loss, dtype, "loss")
    pair = (standin.array(np.full_like(x1, np.nan)), standin.array(np.full_like(x1, np.nan)))
    got = F.cosine_embedding_loss_backward(standin.array(np.ones(N, np_dtype)), c1, c2, cy,
                                           0.0, "none", out=pair)
    assert all(a is b for a, b in zip(got, pair))
    _close(pair[0], dx1, dtype, "grad", m1)
    _close(pair[1], dx2, dtype, "grad", m2)
    assert np.shares_memory(standin.launches[-1].args["dx1"], pair[0])

    # The gradients written over the inputs themselves: the kernel (__restrict__) must not.
    standin.launches.clear()
    total = standin.array(np.full((), np.nan, np_dtype))
    F.cosine_embedding_loss_fused(c1, c2, cy, 0.0, "sum", out=(total, c1, c2))
    (launch,) = standin.launches
    assert not np.shares_memory(launch.args["dx1"], c1)
    _close(total, loss.sum(), dtype, "loss")
    _close(c1, dx1, dtype, "grad", m1)
    _close(c2, dx2, dtype, "grad", m2)


def test_cupy_unbatched_and_views(standin):
    x1, x2, y = _inputs(N, 66, np.float32, seed=3)
    c1, c2, cy = (standin.array(a) for a in (x1, x2, y))
    # (D,) inputs with a 0-d target (and a 0-d grad for "none"): one row, results squeezed.
    for reduction in REDUCTIONS:
        grad = standin.array(np.float32(2.0)) if reduction == "none" else 2.0
        got = F.cosine_embedding_loss_fused(c1[1], c2[1], cy[1], 0.1, reduction, grad)
        want, size = _expected(x1[1:2], x2[1:2], y[1:2], 0.1, reduction, 2.0)
        assert [g.shape for g in got] == [(), (66,), (66,)]
        for g, w, s, kind in zip(got, want, (1.0, *size), ("loss", "grad", "grad")):
            _close(g, w, "f32", kind, s)
    assert standin.ids() == ["cosine_embedding_loss_fused__f32__128"] * 3
    # Transposed, strided, and contiguous but 4 bytes off 16-byte alignment (the scalar path).
    wide = standin.array(np.repeat(x1, 2, axis=1))
    shifted = standin.array(np.concatenate([[0], x1.ravel()]).astype(np.float32))
    offset = shifted[1:].reshape(N, 66)
    assert offset.flags.c_contiguous and offset.data.ptr % 16
    want, size = _expected(x1, x2, y, 0.1, "none", 1.0)
    for view in (standin.array(np.asfortranarray(x1)), wide[:, ::2], offset):
        got = F.cosine_embedding_loss_fused(view, c2, cy, 0.1, "none")
        for g, w, s, kind in zip(got, want, (1.0, *size), ("loss", "grad", "grad")):
            _close(g, w, "f32", kind, s)
    assert standin.launches[-1].args["x1"].data.ptr == offset.data.ptr  # no copy


def test_cupy_no_rows(standin):
    empty = standin.array(np.zeros((0, 4), np.float32))
    no_labels = standin.array(np.zeros(0, np.float32))
    assert np.isnan(F.cosine_embedding_loss(empty, empty, no_labels))
    assert F.cosine_embedding_loss(empty, empty, no_labels, reduction="sum") == 0
    loss, dx1, dx2 = F.cosine_embedding_loss_fused(empty, empty, no_labels, reduction="none")
    assert type(loss) is DeviceArray and loss.shape == (0,) and dx1.shape == dx2.shape == (0, 4)
    dx1, _ = F.cosine_embedding_loss_backward(standin.array(np.zeros(0, np.float32)), empty,
                                              empty, no_labels, reduction="none")
    assert dx1.shape == (0, 4) and dx1.dtype == np.float32
    assert standin.launches == []


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_cupy_float64_label_near_one(standin, dtype):
    """1 + 1e-12 is not a label of +-1, though it rounds to 1.0 in float32: loss 0, as on the
    CPU path."""
    x1, x2, _ = _inputs(N, 33, CUPY_DTYPES[dtype], seed=4)
    y = np.full(N, 1 + 1e-12)
    assert F.cosine_embedding_loss(x1, x2, y, reduction="sum") == 0.0
    loss, dx1, _ = F.cosine_embedding_loss_fused(standin.array(x1), standin.array(x2),
                                                 standin.array(y), reduction="sum")
    assert float(loss) == 0.0 and not dx1.any()
    assert standin.launches[0].args["y"].dtype == dtypes.get(dtype).acc


def test_cupy_errors_launch_nothing(standin):
    x1, x2, y = _inputs(N, 33, np.float32, seed=5)
    c1, c2, cy = (standin.array(a) for a in (x1, x2, y))  # labels 0 and 2 at rows 2, 3
    out = standin.array(np.full(N, 7.0, np.float32))
    with pytest.raises(ValueError, match=r"target\[2\]"):
        F.cosine_embedding_loss(c1, c2, cy, reduction="none", validate_target=True, out=out)
    with pytest.raises(TypeError, match="cupy"):
        F.cosine_embedding_loss(x1, c2, cy)
    with pytest.raises(TypeError, match="cupy"):
        F.cosine_embedding_loss_backward(np.ones(N, np.float32), c1, c2, cy, reduction="none")
    assert standin.launches == [] and (out == 7).all()


# -- cek.gpu.launch and load ------------------------------------------------------------------


def test_gpu_launch_checks_devices_and_passes_no_dy(standin):
    x1, x2, y = _inputs(N, 33, np.float32, seed=8)
    c1, c2, cy = (standin.array(a) for a in (x1, x2, y))
    # The fused kernel without a grad array: dy is None (nullptr), which has no device.
    loss, _, _ = F.cosine_embedding_loss_fused(c1, c2, cy)
    assert standin.launches[0].args["dy"] is None
    _close(loss, _expected(x1, x2, y, 0.0, "mean", 1.0)[0][0], "f32", "loss")
    # load() refuses arrays on another device than the current one.
    kernel = CosineEmbeddingLossFused.for_n_dim(33)
    args = (c1, c2, cy, None, 1.0, cy.copy(), c1.copy(), c2.copy(), N, 33, 0.0)
    with standin.cupy.cuda.Device(1), pytest.raises(TypeError, match="not the current GPU 1"):
        gpu.launch(kernel, *args)
    assert len(standin.launches) == 1


# -- cek.torch's CUDA helpers, called on CPU tensors --------------------------------------------

STREAM = 0xC0FFEE  # the pointer torch.cuda.current_stream() gives in these tests


@pytest.fixture
def cuda(standin, monkeypatch):
    """(torch, cek.torch) with torch.cuda.current_stream standing in."""
    torch = pytest.importorskip("torch")
    import cek.torch as ct

    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=STREAM))
    return torch, ct


TORCH_DTYPES = ["f32", "f16", "bf16", "f64"]


def _torch_dtype(torch, dtype):
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
            "f64": torch.float64}[dtype]


def _torch_inputs(torch, n, d, dtype, seed):
    x1, x2, y = _inputs(n, d, np.float64, seed)
    dt = _torch_dtype(torch, dtype)
    return torch.from_numpy(x1).to(dt), torch.from_numpy(x2).to(dt), torch.from_numpy(y)


def _bits(torch, tensor):
    """The memory of a CPU tensor as NumPy (bfloat16 as its int16 bits)."""
    return tensor.view(torch.int16).numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_fused_and_backward_match_autograd(standin, cuda, dtype, reduction, batched):
    torch, ct = cuda
    x1, x2, y = _torch_inputs(torch, N, 33, dtype, seed=6)
    if not batched:
        x1, x2, y = x1[1], x2[1], y[1]
    loss, dx1, dx2 = ct._cuda_fused(x1, x2, y, 0.1, reduction, True)

    (launch,) = standin.launches
    assert launch.kernel_id == f"cosine_embedding_loss_fused__{dtype}__64"
    assert launch.stream == STREAM  # launched on torch's current stream
    # The kernel of the dtype, reading the tensors' own memory and writing torch's buffers.
    assert launch.args["x1"].dtype == (np.uint16 if dtype == "bf16" else _bits(torch, x1).dtype)
    assert np.array_equal(launch.args["x1"].view(_bits(torch, x1).dtype),
                          _bits(torch, x1.reshape(-1, 33)))
    assert np.shares_memory(launch.args["dx1"], _bits(torch, dx1))
    assert np.shares_memory(launch.args["dx2"], _bits(torch, dx2))

    f1, f2 = (t.double().reshape(-1, 33).numpy() for t in (x1, x2))  # the rounded inputs
    fy = y.double().reshape(-1).numpy()
    a1, a2 = (torch.from_numpy(f.copy()).reshape(x1.shape).requires_grad_() for f in (f1, f2))
    want = torch.nn.functional.cosine_embedding_loss(a1, a2, y.double(), 0.1, reduction=reduction)
    assert loss.dtype == x1.dtype and loss.shape == want.shape
    assert dx1.dtype == dx2.dtype == x1.dtype and dx1.shape == x1.shape
    _close(loss.double(), want.detach(), dtype, "loss")

    # grad_output 1: the saved gradients, as they are.
    ctx = types.SimpleNamespace(saved_tensors=(dx1, dx2))
    g1, g2 = ct._cuda_backward(ctx, torch.ones_like(loss))
    assert g1 is dx1 and g2 is dx2
    _, sizes = _expected(f1, f2, fy, 0.1, reduction, 1.0)
    refs = torch.autograd.grad(want, (a1, a2), torch.ones_like(want), retain_graph=True)
    for got, ref, size in zip((g1, g2), refs, sizes):
        _close(got.double(), ref, dtype, "grad", size)

    # Any other grad_output (per row for "none"): the saved gradients times it.
    if reduction == "none":
        w = torch.linspace(0.5, 2.0, N, dtype=torch.float64)[:want.numel()].reshape(want.shape)
    else:
        w = torch.tensor(3.0, dtype=torch.float64)
    g1, g2 = ct._cuda_backward(ctx, w.to(x1.dtype))
    _, sizes = _expected(f1, f2, fy, 0.1, reduction, w.numpy())
    kind = "scaled" if dtype in ("f16", "bf16") else "grad"
    for got, ref, size in zip((g1, g2), torch.autograd.grad(want, (a1, a2), w), sizes):
        assert got.dtype == x1.dtype and got.shape == x1.shape
        _close(got.double(), ref, dtype, kind, size)
    assert len(standin.launches) == 1  # the backward launches nothing

    # No gradients wanted: the forward kernel, and nothing kept.
    standin.launches.clear()
    loss2, n1, n2 = ct._cuda_fused(x1, x2, y, 0.1, reduction, False)
    assert standin.ids() == [f"cosine_embedding_loss_forward_rows__{dtype}__64"]
    assert n1 is None and n2 is None
    _close(loss2.double(), want.detach(), dtype, "loss")


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("d", [256, 768, 20000])
def test_torch_row_widths(standin, cuda, d, dtype):
    torch, ct = cuda
    x1, x2, y = _torch_inputs(torch, 3, d, dtype, seed=d)
    loss, dx1, dx2 = ct._cuda_fused(x1, x2, y, -0.25, "mean", True)
    assert standin.ids() == [f"cosine_embedding_loss_fused__{dtype}__{WIDTHS[d]}"]
    f1, f2 = x1.double().numpy(), x2.double().numpy()
    want, size = _expected(f1, f2, y.numpy(), -0.25, "mean", 1.0)
    for g, w, s, kind in zip((loss, dx1, dx2), want, (1.0, *size), ("loss", "grad", "grad")):
        _close(g.double(), w, dtype, kind, s)


def test_torch_views_labels_and_no_rows(standin, cuda):
    torch, ct = cuda
    x1, x2, y = _torch_inputs(torch, N, 40, "f32", seed=7)
    # Transposed inputs are copied to contiguous ones; labels of any dtype.
    for target in (y, y.to(torch.int64), y.to(torch.bfloat16), y.to(torch.float16)):
        loss, dx1, _ = ct._cuda_fused(x1.t().contiguous().t(), x2, target, 0.1, "none", True)
        want, size = _expected(x1.numpy(), x2.numpy(), y.numpy(), 0.1, "none", 1.0)
        _close(loss, want[0], "f32", "loss")
        _close(dx1, want[1], "f32", "grad", size[0])
    # float64 labels of 1 + 1e-12 are no label of +-1, as on the CPU path.
    near_one = torch.full((N,), 1 + 1e-12, dtype=torch.float64)
    loss, dx1, _ = ct._cuda_fused(x1, x2, near_one, 0.0, "sum", True)
    assert loss.item() == 0.0 and not dx1.any()
    assert standin.launches[-1].args["y"].dtype == np.float32
    # N = 0: no launch; the mean of no rows is NaN, their sum 0.
    standin.launches.clear()
    empty = torch.zeros(0, 5)
    loss, dx1, dx2 = ct._cuda_fused(empty, empty, torch.zeros(0), 0.0, "mean", True)
    assert torch.isnan(loss) and dx1.shape == dx2.shape == (0, 5)
    loss, _, _ = ct._cuda_fused(empty, empty, torch.zeros(0), 0.0, "sum", False)
    assert loss.item() == 0.0
    loss, _, _ = ct._cuda_fused(empty, empty, torch.zeros(0), 0.0, "none", True)
    assert loss.shape == (0,)
    assert standin.launches == []


def test_torch_autograd_function_cuda_branch(standin, cuda):
    """cek.torch's public API on tensors that answer is_cuda (CPU tensors underneath, so only
    this attribute differs): one fused launch per training step, none in the backward."""
    torch, ct = cuda

    class CudaLike(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    x1, x2, y = _torch_inputs(torch, N, 33, "f32", seed=9)
    c1, c2 = (t.clone().as_subclass(CudaLike).requires_grad_() for t in (x1, x2))
    cy = y.as_subclass(CudaLike)
    for reduction, step in (("mean", lambda loss: loss), ("none", lambda loss: loss.mean())):
        standin.launches.clear()
        c1.grad = c2.grad = None
        step(ct.cosine_embedding_loss(c1, c2, cy, 0.1, reduction=reduction)).backward()
        assert standin.ids() == ["cosine_embedding_loss_fused__f32__64"]
        a1, a2 = (t.double().requires_grad_() for t in (x1, x2))
        torch.nn.functional.cosine_embedding_loss(a1, a2, y, 0.1).backward()
        _, sizes = _expected(x1.numpy(), x2.numpy(), y.numpy(), 0.1, "mean", 1.0)
        for got, ref, size in zip((c1.grad, c2.grad), (a1.grad, a2.grad), sizes):
            _close(got.detach(), ref, "f32", "grad", size)
    standin.launches.clear()
    with torch.no_grad():
        ct.cosine_embedding_loss(c1, c2, cy)
    assert standin.ids() == ["cosine_embedding_loss_forward_rows__f32__64"]
