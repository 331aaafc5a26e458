"""The GPU glue without a GPU: cek.functional on CuPy arrays, with
NumPy standing in for CuPy and the CPU emulator (the real kernels) standing in for the device
(tests/fake_cupy.py, shared with tests/test_bench.py); cek.torch's CUDA ops are tested the same
way in tests/test_torch_cuda_glue.py, with this file's helpers.

Launches go through cek.gpu.launch and cek.gpu.load themselves; only the compiled function
(cek.gpu.get_function, NVRTC) is replaced by the emulator. So the stand-in proves what the glue
decides: which kernel it launches (name, dtype, BLOCK_SIZE), once, with arguments that pass
cek.gpu's checks, inside the device and stream contexts it sets up, into which buffers, and what
it delivers from them. It cannot prove what only CuPy and a driver do: the real DLPack exchange
and its stream handshake, stream ordering, device memory, CuPy's own reductions and casts. The
gpu tier of tests/test_functional.py and tests/test_torch.py does.
"""


import numpy as np
import pytest
from fake_cupy import DeviceArray, install

from cek import cosine_embedding_loss_split as split
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
# 65536 streamed (> 16384 elements), three rows of which split in every dtype (of 32768 they
# split in float32 and double alone since cek/split_model.py counts the split's instruction issue).
WIDTHS = {1: 1, 33: 64, 256: 256, 768: 1024, 65536: 65536}  # D: BLOCK_SIZE
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


# Rows that cycle through each branch of the loss and its gradient (cek_row_coeff,
# cek_row_loss): label 1; label -1 with c above the margin, between 0 and the margin (where a
# margin dropped, or read as 0, gives another loss and gradient), below both; a zero row (x1
# and x2 zero: c = 0 and EPS alone keeps r finite); a label that is not +-1.
BRANCH_ROWS = ("label 1", "above", "between", "below", "zero", "no label", "between")


def _branch_rows(x1, margin, rng):
    """(x1, x2, y): x2 at the cosine to x1 that each row's branch asks for (BRANCH_ROWS), of a
    random length; x1 and x2 zero in a zero row."""
    n, d = x1.shape
    low, high = min(margin, 0.0), max(margin, 0.0)
    cosines = {"above": high + 0.6 * (1 - high), "below": low - 0.6 * (1 + low),
               "between": margin / 2 if margin else 0.3}
    labels = {"label 1": 1.0, "zero": 1.0, "no label": 2.0}
    x1, x2, y = x1.copy(), np.empty_like(x1), np.empty(n)
    for r in range(n):
        kind = BRANCH_ROWS[r % len(BRANCH_ROWS)]
        u = x1[r] / np.linalg.norm(x1[r])
        v = rng.standard_normal(d)
        v -= (v @ u) * u
        v /= np.linalg.norm(v)
        c = cosines.get(kind, rng.uniform(-0.9, 0.9))
        x2[r] = rng.uniform(0.5, 2.0) * np.sqrt(d) * (c * u + np.sqrt(1 - c * c) * v)
        y[r] = labels.get(kind, -1.0)
        if kind == "zero":
            x1[r] = x2[r] = 0.0
    return x1, x2, y


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
    # every branch of the loss at margin 0.25 (BRANCH_ROWS), in the inputs' dtype
    x1, x2, y = (a.astype(CUPY_DTYPES[dtype]) for a in _branch_rows(
        _inputs(N, 33, np.float64, seed=1)[0], 0.25, np.random.default_rng(1)))
    c1, c2, cy = (standin.array(a) for a in (x1, x2, y))
    grad = _grad(reduction, N, CUPY_DTYPES[dtype])
    cgrad = standin.array(grad) if reduction == "none" else grad
    (loss, dx1, dx2), (m1, m2) = _expected(x1, x2, y, 0.25, reduction, grad)

    def check(results, kernel, want, size):
        # A loss's mean or sum: the reduction of the per-row losses, launched second.
        reduce = ([f"cosine_embedding_loss_reduce__{dtype}__1024"]
                  if reduction != "none" and kernel != "backward_rows" else [])
        assert standin.ids() == [f"cosine_embedding_loss_{kernel}__{dtype}__64", *reduce]
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


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", list(CUPY_DTYPES))
@pytest.mark.parametrize("d", [33, 768])
def test_cupy_mean_and_sum_are_the_kernels_own(standin, d, dtype, reduction):
    """The row kernel, then the reduction of the losses it wrote (one block, a fixed order):
    the reduction's value is the result (no CuPy mean or sum over the rows), in the inputs'
    dtype."""
    x1, x2, y = _inputs(N, d, CUPY_DTYPES[dtype], seed=4)
    c1, c2, cy = (standin.array(a) for a in (x1, x2, y))
    (loss, dx1, dx2), (m1, m2) = _expected(x1, x2, y, 0.25, reduction, 1.0)
    for kernel, call in (("forward_rows", F.cosine_embedding_loss),
                         ("fused", F.cosine_embedding_loss_fused)):
        standin.launches.clear()
        results = call(c1, c2, cy, 0.25, reduction)
        got = results if kernel == "forward_rows" else results[0]
        rows, reduce = standin.launches
        assert rows.kernel_id.startswith(f"cosine_embedding_loss_{kernel}__{dtype}__")
        assert reduce.kernel_id == f"cosine_embedding_loss_reduce__{dtype}__1024"
        assert standin.reductions == []
        assert np.shares_memory(reduce.args["loss"], rows.args["loss" if kernel == "fused"
                                                               else "out"])
        assert got.shape == () and got.dtype == x1.dtype
        assert np.shares_memory(got, reduce.args["reduced"])  # the kernel's value, not a copy
        acc = dtypes.get(dtype).acc.type
        assert reduce.args["scale"] == acc(1.0 / N if reduction == "mean" else 1.0)
        _close(got, loss, dtype, "loss")
        if kernel == "fused":
            _close(results[1], dx1, dtype, "grad", m1)
            _close(results[2], dx2, dtype, "grad", m2)


# Losses one launch of the reduction adds (two trips of one block); above, two launches.
ONE_LAUNCH = {"f32": 65536, "f16": 65536, "bf16": 65536, "f64": 32768}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("dtype", list(CUPY_DTYPES))
def test_cupy_mean_of_many_rows_is_two_reduction_launches(standin, dtype, reduction):
    """Past ONE_LAUNCH rows, a block per slice of the per-row losses writes a partial sum into a
    workspace from CuPy's allocator, then one block adds those with the scale: the bits of
    that order (tests/test_cosine_embedding_loss_reduce.py's model), the reference's value."""
    from test_cosine_embedding_loss_reduce import partials_model, two_level_model

    n = ONE_LAUNCH[dtype] + 5  # three slices, the last of 5 losses
    x1, x2, y = _inputs(n, 4, CUPY_DTYPES[dtype], seed=8)
    (loss, _, _), _ = _expected(x1, x2, y, 0.25, reduction, 1.0)
    got = F.cosine_embedding_loss(*(standin.array(a) for a in (x1, x2, y)), 0.25, reduction)
    rows, first, second = standin.launches
    reduce = f"cosine_embedding_loss_reduce__{dtype}__1024"
    assert (rows.kernel_id, first.kernel_id, second.kernel_id) == (
        f"cosine_embedding_loss_forward_rows__{dtype}__4", reduce, reduce)
    partials = first.args["partials"]
    assert partials.shape == (3,) and partials.dtype == dtypes.get(dtype).acc
    assert first.args["loss"] is rows.args["out"] and first.args["n_rows"] == n
    assert second.args["loss"] is partials and second.args["n_rows"] == 3
    assert second.args["partials"] is None
    assert np.shares_memory(got, second.args["reduced"])
    scale = 1.0 / n if reduction == "mean" else 1.0
    assert first.args["scale"] == second.args["scale"] == dtypes.get(dtype).acc.type(scale)
    per_row = np.asarray(rows.args["out"])
    assert np.asarray(partials).tobytes() == partials_model(per_row, dtype).tobytes()
    assert np.asarray(got).tobytes() == two_level_model(per_row, scale, dtype).tobytes()
    _close(got, loss, dtype, "loss", 1.0 if reduction == "mean" else n)
    standin.launches.clear()
    F.cosine_embedding_loss(*(standin.array(a) for a in (x1[:-5], x2[:-5], y[:-5])), 0.25,
                            reduction)
    assert standin.ids()[1:] == [reduce]  # ONE_LAUNCH rows: one launch


@pytest.mark.parametrize("split_below", [None, 3])
@pytest.mark.parametrize("dtype", list(CUPY_DTYPES))
@pytest.mark.parametrize("d", list(WIDTHS))
def test_cupy_row_widths(standin, monkeypatch, d, dtype, split_below):
    """Every path of the fused kernel: row groups, registers, streamed rows; and a few streamed
    rows split across blocks, the split's pair then the reduction. With split_below = 3 the
    3 streamed rows are as many as the launchers split below (SPLIT_BELOW_ROWS), and the
    one-block-per-row kernel streams them."""
    if split_below is not None:
        monkeypatch.setattr(split, "SPLIT_BELOW_ROWS", split_below)
    n = 3 if d > 1000 else N
    x1, x2, y = _inputs(n, d, CUPY_DTYPES[dtype], seed=d)
    got = F.cosine_embedding_loss_fused(*(standin.array(a) for a in (x1, x2, y)), -0.25, "sum")
    kernel = CosineEmbeddingLossFused.for_n_dim(d, dtype)
    reduce = f"cosine_embedding_loss_reduce__{dtype}__1024"
    if kernel.streamed and split_below is None:
        assert standin.ids() == [f"cosine_embedding_loss_split_sums__{dtype}__1024",
                                 f"cosine_embedding_loss_split_fused__{dtype}__1024", reduce]
    else:
        assert standin.ids() == [f"cosine_embedding_loss_fused__{dtype}__{WIDTHS[d]}", reduce]
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
    launch, _ = standin.launches  # the fused kernel, then the reduction of its losses
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
    fused = "cosine_embedding_loss_fused__f32__128"
    reduce = "cosine_embedding_loss_reduce__f32__1024"
    assert standin.ids() == [fused, fused, reduce, fused, reduce]  # none, mean, sum
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
    args = (c1, c2, cy, None, 0, 1.0, cy.copy(), c1.copy(), c2.copy(), None, None, N, 33, 0.0)
    with standin.cupy.cuda.Device(1), pytest.raises(TypeError, match="not the current GPU 1"):
        gpu.launch(kernel, *args)
    assert len(standin.launches) == 2  # the mean's: the fused kernel and the reduction
