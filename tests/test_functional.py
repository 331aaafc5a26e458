"""cek.functional: the NumPy path (cpu tier) against the float64 reference, bad input, and the
CuPy path (gpu tier, skipped without a device)."""

import subprocess
import sys
import threading

import fake_cupy
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cek import dtypes, gpu, reference
from cek import functional as F
from cek import cosine_embedding_loss_split as split
from oracle import NUMPY_TOLERANCES, assert_bf16_close, expected, expected_and_sizes

TOLERANCES = NUMPY_TOLERANCES  # x1 and x2: {dtype: (rtol, atol)} for "loss" and "grad"

DIMS = [1, 31, 32, 33, 127, 769, 1000, 4097]
ROWS = [1, 7]
DTYPES = [np.float64, np.float32, np.float16]
MARGINS = [-0.5, 0.0, 0.5]
REDUCTIONS = ["none", "mean", "sum"]
LABELS = (1.0, -1.0, 0.0, 2.0)  # 0 and 2: torch gives loss 0 and gradient 0

needs_gpu = pytest.mark.skipif(gpu.device_count() == 0, reason="no CUDA device: gpu tier skipped")


def _away_from_zero(a):
    return a + np.copysign(0.5, a)


def _inputs(n, d, dtype=np.float64, seed=0):
    """x2 is a random multiple of x1 plus noise, so cosines spread over (-1, 1). Elements are
    at least 0.5 in size: see the gradient tolerances."""
    rng = np.random.default_rng(seed)
    x1 = _away_from_zero(rng.standard_normal((n, d)))
    x2 = _away_from_zero(rng.uniform(-1, 1, (n, 1)) * x1 + rng.standard_normal((n, d)))
    y = np.array([LABELS[i % 4] for i in range(n)])
    return x1.astype(dtype), x2.astype(dtype), y.astype(dtype)


_expected = expected


def _close(got, want, dtype, what):
    rtol, atol = TOLERANCES[dtype][what]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)


def _grad_for(reduction, n, dtype, seed=1):
    if reduction == "none":
        return np.random.default_rng(seed).uniform(0.5, 2.0, n).astype(dtype)
    return 1.5


# -- values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("d", DIMS)
def test_loss_backward_fused_match_reference(d, n, dtype):
    x1, x2, y = _inputs(n, d, dtype, seed=d * 10 + n)
    for i, reduction in enumerate(REDUCTIONS):
        margin = MARGINS[(d + i) % 3]
        grad = _grad_for(reduction, n, dtype)
        loss, dx1, dx2 = _expected(x1, x2, y, margin, reduction, grad)

        got = F.cosine_embedding_loss(x1, x2, y, margin, reduction)
        assert got.dtype == dtype and got.shape == np.shape(loss) and isinstance(got, np.ndarray)
        _close(got, loss, dtype, "loss")

        g1, g2 = F.cosine_embedding_loss_backward(grad, x1, x2, y, margin, reduction)
        assert g1.dtype == g2.dtype == dtype and g1.shape == g2.shape == x1.shape
        _close(g1, dx1, dtype, "grad")
        _close(g2, dx2, dtype, "grad")

        f_loss, f1, f2 = F.cosine_embedding_loss_fused(x1, x2, y, margin, reduction, grad)
        _close(f_loss, loss, dtype, "loss")
        _close(f1, dx1, dtype, "grad")
        _close(f2, dx2, dtype, "grad")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_fused_default_grad_is_one(reduction):
    x1, x2, y = _inputs(7, 33)
    ones = np.ones(7) if reduction == "none" else 1.0
    want = F.cosine_embedding_loss_fused(x1, x2, y, 0.25, reduction, ones)
    got = F.cosine_embedding_loss_fused(x1, x2, y, 0.25, reduction)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "grad", [3.0, 3, np.float32(3.0), np.array(3.0), np.array(3.0, np.float32)])
def test_scalar_grad_forms(grad):
    x1, x2, y = _inputs(7, 33)
    _, dx1, dx2 = _expected(x1, x2, y, 0.0, "mean", 3.0)
    g1, g2 = F.cosine_embedding_loss_backward(grad, x1, x2, y, reduction="mean")
    _close(g1, dx1, np.float64, "grad")
    _close(g2, dx2, np.float64, "grad")


def test_integer_labels_match_float_labels():
    x1, x2, y = _inputs(8, 33)
    for reduction in REDUCTIONS:
        a = F.cosine_embedding_loss_fused(x1, x2, y.astype(np.int64), 0.1, reduction)
        b = F.cosine_embedding_loss_fused(x1, x2, y, 0.1, reduction)
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)


# -- shapes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_dimensional_inputs_squeeze_like_torch(dtype):
    x1, x2, y = _inputs(2, 33, dtype)
    for reduction in REDUCTIONS:
        loss = F.cosine_embedding_loss(x1[1], x2[1], y[1], 0.0, reduction)
        assert loss.shape == ()
        want = F.cosine_embedding_loss(x1[1:2], x2[1:2], y[1:2], 0.0, "none")[0]
        np.testing.assert_array_equal(loss, want)
        grad = np.array(2.0, dtype) if reduction == "none" else 2.0
        f_loss, dx1, dx2 = F.cosine_embedding_loss_fused(x1[1], x2[1], y[1], 0.0, reduction, grad)
        assert f_loss.shape == () and dx1.shape == dx2.shape == (33,)
        g1, g2 = F.cosine_embedding_loss_backward(grad, x1[1], x2[1], y[1], 0.0, reduction)
        np.testing.assert_array_equal(g1, dx1)
        np.testing.assert_array_equal(g2, dx2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_rows(dtype):
    x1 = np.zeros((0, 5), dtype)
    y = np.zeros(0, dtype)
    assert F.cosine_embedding_loss(x1, x1, y, reduction="none").shape == (0,)
    assert np.isnan(F.cosine_embedding_loss(x1, x1, y, reduction="mean"))  # as torch
    assert F.cosine_embedding_loss(x1, x1, y, reduction="sum") == 0
    loss, dx1, dx2 = F.cosine_embedding_loss_fused(x1, x1, y, reduction="mean")
    assert np.isnan(loss) and loss.dtype == dtype and dx1.shape == dx2.shape == (0, 5)
    g1, g2 = F.cosine_embedding_loss_backward(np.zeros(0, dtype), x1, x1, y, reduction="none")
    assert g1.shape == g2.shape == (0, 5) and g1.dtype == dtype


@pytest.mark.parametrize("view", ["transposed", "sliced", "fortran", "negative stride"])
def test_non_contiguous_inputs_match_contiguous_copies(view):
    x1, x2, y = _inputs(7, 66)
    make = {
        "transposed": lambda a: np.ascontiguousarray(a.T).T,
        "sliced": lambda a: np.repeat(a, 2, axis=1)[:, ::2],
        "fortran": np.asfortranarray,
        "negative stride": lambda a: a[::-1, ::-1].copy()[::-1, ::-1],
    }[view]
    v1, v2, vy = make(x1), make(x2), np.repeat(y, 3)[::3]
    assert not v1.flags.c_contiguous and not vy.flags.c_contiguous
    np.testing.assert_array_equal(v1, x1)
    grad = np.repeat(np.arange(1.0, 8.0), 2)[::2]
    for reduction, g in (("none", grad), ("mean", 1.0), ("sum", 2.0)):
        got = F.cosine_embedding_loss_fused(v1, v2, vy, 0.1, reduction, g)
        g_copy = g.copy() if reduction == "none" else g
        want = F.cosine_embedding_loss_fused(x1, x2, y, 0.1, reduction, g_copy)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


# -- labels, NaN, Inf --------------------------------------------------------------------------


def test_other_labels_give_zero_loss_and_zero_gradient():
    x1, x2, _ = _inputs(5, 33)
    y = np.array([0.0, 2.0, 0.5, np.nan, -3.0])
    loss, dx1, dx2 = F.cosine_embedding_loss_fused(x1, x2, y, 0.0, "none", np.ones(5))
    np.testing.assert_array_equal(loss, 0.0)
    np.testing.assert_array_equal(dx1, 0.0)
    np.testing.assert_array_equal(dx2, 0.0)


@pytest.mark.parametrize("bad, row", [(0.0, 2), (2.0, 0), (np.nan, 6), (0.5, 3)])
def test_validate_target_names_first_bad_label_and_row(bad, row):
    x1, x2, _ = _inputs(7, 33)
    y = np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0])
    y[row] = bad
    if row < 6:
        y[6] = 5.0  # a later bad label must not be the one named
    with pytest.raises(ValueError, match=rf"target\[{row}\] = {bad!r}"):
        F.cosine_embedding_loss(x1, x2, y, validate_target=True)
    with pytest.raises(ValueError, match=rf"target\[{row}\]"):
        F.cosine_embedding_loss_fused(x1, x2, y, validate_target=True)
    with pytest.raises(ValueError, match=rf"target\[{row}\]"):
        F.cosine_embedding_loss_backward(1.0, x1, x2, y, validate_target=True)
    good = np.where(np.arange(7) % 2, -1.0, 1.0)
    F.cosine_embedding_loss(x1, x2, good, validate_target=True)  # all +-1: no error


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_propagate_to_their_row(dtype, poison):
    x1, x2, _ = _inputs(4, 33, dtype)
    y = np.array([1.0, -1.0, 0.0, 1.0], dtype)
    for row in range(3):  # rows 0-2 poisoned, one per label; row 3 stays clean
        x1[row, 5] = poison
    loss, dx1, dx2 = F.cosine_embedding_loss_fused(x1, x2, y, -0.5, "none")
    assert np.isnan(loss[:2]).all(), loss  # labels +-1: never a silent 0
    assert loss[2] == 0  # label 0: torch's loss is 0 whatever the row holds
    assert np.isnan(dx1[:3]).all() and np.isnan(dx2[:3]).all()
    assert np.isfinite(loss[3]) and np.isfinite(dx1[3]).all() and np.isfinite(dx2[3]).all()
    for reduction in ("mean", "sum"):
        assert np.isnan(F.cosine_embedding_loss(x1, x2, y, -0.5, reduction))


def test_nan_grad_propagates():
    x1, x2, y = _inputs(4, 33)
    dx1, _ = F.cosine_embedding_loss_backward(np.array([np.nan, 1, 1, 1]), x1, x2, np.ones(4),
                                              reduction="none")
    assert np.isnan(dx1[0]).all() and np.isfinite(dx1[1:]).all()


# -- half precision: the three failures of eager torch on float16 ------------------------------


def test_float16_zero_vector_gives_finite_loss():
    # torch float16: EPS = 1e-12 rounds to 0 in half, 0/0 = NaN.
    x1 = np.zeros((2, 64), np.float16)
    x2 = np.ones((2, 64), np.float16)
    y = np.array([1.0, -1.0], np.float16)
    loss = F.cosine_embedding_loss(x1, x2, y, 0.0, "none")
    _close(loss, reference.forward(x1, x2, y), np.float16, "loss")
    np.testing.assert_array_equal(loss, [1.0, 0.0])


def test_float16_large_rows_do_not_overflow():
    # torch float16: sq1*sq2 = 25600**2 overflows to inf, so c = 0 and identical rows get loss 1.
    x = np.full((3, 64), 20.0, np.float16)
    x[2] = 200.0  # sq = 2.56e6 overflows even on its own in half
    y = np.ones(3, np.float16)
    loss, dx1, dx2 = F.cosine_embedding_loss_fused(x, x.copy(), y, 0.0, "none")
    _close(loss, reference.forward(x, x, y), np.float16, "loss")
    np.testing.assert_array_equal(loss, 0.0)
    assert np.isfinite(dx1).all() and np.isfinite(dx2).all()


def test_float16_small_rows_do_not_underflow():
    # torch float16: sq1*sq2 underflows to 0, the cosine divides by 0 and the loss is -inf.
    x = np.full((2, 64), 1e-3, np.float16)
    x[1] = 1e-4
    y = np.ones(2, np.float16)
    loss, dx1, dx2 = F.cosine_embedding_loss_fused(x, x.copy(), y, 0.0, "none")
    ref = reference.forward(x, x, y)
    _close(loss, ref, np.float16, "loss")
    assert np.isfinite(loss).all() and np.isfinite(dx1).all() and np.isfinite(dx2).all()
    r1, r2 = reference.backward(np.ones(2), x, x, y)
    _close(dx1, r1, np.float16, "grad")
    _close(dx2, r2, np.float16, "grad")


# -- properties --------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(d=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), scale=st.floats(1e-2, 1e3))
def test_properties(d, seed, scale):
    # float32: float64 would resolve EPS = 1e-12 itself, which is neither 0 for loss(x, x, +1)
    # nor scale invariant.
    dtype = np.float32
    x1, x2, y = _inputs(4, d, dtype, seed)
    same = F.cosine_embedding_loss(x1, x1, np.ones(4, dtype), reduction="none")
    _close(same, np.zeros(4), dtype, "loss")  # loss(x, x, +1) = 0
    loss = F.cosine_embedding_loss(x1, x2, y, 0.0, "none")
    atol = TOLERANCES[dtype]["loss"][1]  # a rounded c may pass 1 by an ulp: 1 - c < 0
    assert ((loss >= -atol) & (loss <= 2 + atol)).all()
    scaled = F.cosine_embedding_loss(x1 * dtype(scale), x2, y, 0.0, "none")
    _close(scaled, loss.astype(np.float64), dtype, "loss")  # c does not see the scale


# -- determinism and threads -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_deterministic(dtype):
    x1, x2, y = _inputs(7, 1000, dtype)
    first = [F.cosine_embedding_loss_fused(x1, x2, y, 0.1, r) for r in REDUCTIONS]
    for _ in range(3):
        again = [F.cosine_embedding_loss_fused(x1.copy(), x2.copy(), y, 0.1, r) for r in REDUCTIONS]
        for a, b in zip(first, again):
            for u, v in zip(a, b):
                assert u.tobytes() == v.tobytes()


def test_thread_safe():
    cases = [_inputs(7, d, dt, seed) for seed, (d, dt) in
             enumerate([(d, dt) for d in (33, 769, 4097) for dt in DTYPES])]
    serial = [F.cosine_embedding_loss_fused(*c, 0.1, "mean") for c in cases]
    results = [[None] * len(cases) for _ in range(8)]
    start = threading.Barrier(8)

    def work(t):
        start.wait()
        for k in range(len(cases) * 3):
            i = (k + t) % len(cases)
            results[t][i] = F.cosine_embedding_loss_fused(*cases[i], 0.1, "mean")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for per_thread in results:
        for got, want in zip(per_thread, serial):
            for u, v in zip(got, want):
                assert u.tobytes() == v.tobytes()


# -- out buffers -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_buffers_are_written_and_returned(dtype):
    x1, x2, y = _inputs(7, 33, dtype)
    loss_out = np.full(7, np.nan, dtype)
    assert F.cosine_embedding_loss(x1, x2, y, reduction="none", out=loss_out) is loss_out
    np.testing.assert_array_equal(loss_out, F.cosine_embedding_loss(x1, x2, y, reduction="none"))
    mean_out = np.full((), np.nan, dtype)
    assert F.cosine_embedding_loss(x1, x2, y, out=mean_out) is mean_out
    triple = (np.full((), np.nan, dtype), np.full_like(x1, np.nan), np.full_like(x1, np.nan))
    got = F.cosine_embedding_loss_fused(x1, x2, y, out=triple)
    assert all(a is b for a, b in zip(got, triple))
    for a, b in zip(triple, F.cosine_embedding_loss_fused(x1, x2, y)):
        np.testing.assert_array_equal(a, b)
    pair = [np.full_like(x1, np.nan), np.full_like(x1, np.nan)]
    got = F.cosine_embedding_loss_backward(1.0, x1, x2, y, out=pair)
    assert got[0] is pair[0] and got[1] is pair[1]
    np.testing.assert_array_equal(pair[0], triple[1])


# -- bad input: a clear error, and out untouched -----------------------------------------------

SENTINEL = -12345.0
N, D = 7, 33


def _good():
    x1, x2, y = _inputs(N, D)
    return {"x1": x1, "x2": x2, "target": y}


def _bad_label():
    y = np.ones(N)
    y[4] = 0.0
    return y


# (name, changes to the good arguments, exception, text the message must contain)
BAD_INPUTS = [
    ("x2 shape", {"x2": np.ones((N, D + 1))}, ValueError, "(7, 34)"),
    ("target shape", {"target": np.ones(N + 1)}, ValueError, "(8,)"),
    ("target 2-d", {"target": np.ones((N, 1))}, ValueError, "(7, 1)"),
    ("3 dims", {"x1": np.ones((N, D, 1)), "x2": np.ones((N, D, 1))}, ValueError, "3 dims"),
    ("0 dims", {"x1": np.array(1.0), "x2": np.array(1.0)}, ValueError, "0 dims"),
    ("D = 0", {"x1": np.ones((N, 0)), "x2": np.ones((N, 0))}, ValueError, "(7, 0)"),
    ("int inputs", {"x1": np.ones((N, D), np.int64), "x2": np.ones((N, D), np.int64)},
     TypeError, "int64"),
    ("complex inputs", {"x1": np.ones((N, D), complex), "x2": np.ones((N, D), complex)},
     TypeError, "complex128"),
    ("mixed dtypes", {"x2": np.ones((N, D), np.float32)}, TypeError, "float32"),
    ("list input", {"x1": [[1.0] * D] * N}, TypeError, "list"),
    ("list target", {"target": [1.0] * N}, TypeError, "list"),
    ("bool target", {"target": np.ones(N, bool)}, TypeError, "bool"),
    ("reduction", {"reduction": "avg"}, ValueError, "'avg'"),
    ("reduction type", {"reduction": None}, ValueError, "None"),
    ("margin nan", {"margin": float("nan")}, ValueError, "nan"),
    ("margin inf", {"margin": float("inf")}, ValueError, "inf"),
    ("margin str", {"margin": "0.5"}, TypeError, "'0.5'"),
    ("margin bool", {"margin": True}, TypeError, "True"),
    ("bad label", {"target": _bad_label(), "validate_target": True}, ValueError, "target[4] = 0.0"),
]


def _call(entry, args, out):
    args = dict(args)
    if entry == "loss":
        return F.cosine_embedding_loss(**args, out=out[0])
    if entry == "backward":
        return F.cosine_embedding_loss_backward(args.pop("grad", 1.0), **args, out=out[1:])
    return F.cosine_embedding_loss_fused(**args, out=out)


def _sentinel_out():
    return (np.full((), SENTINEL), np.full((N, D), SENTINEL), np.full((N, D), SENTINEL))


@pytest.mark.parametrize("entry", ["loss", "backward", "fused"])
@pytest.mark.parametrize("name, change, error, text", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_and_leaves_out_untouched(entry, name, change, error, text):
    out = _sentinel_out()
    with pytest.raises(error) as info:
        _call(entry, {**_good(), **change}, out)
    assert text in str(info.value), str(info.value)
    for buffer in out:
        assert (buffer == SENTINEL).all()


# (name, entry, out for that entry, grad, exception, text)
BAD_OUT_OR_GRAD = [
    ("loss out shape", "loss", np.full(N, SENTINEL), None, ValueError, "(7,)"),
    ("loss out dtype", "loss", np.full((), SENTINEL, np.float32), None, TypeError, "float32"),
    ("loss out kind", "loss", [SENTINEL], None, TypeError, "list"),
    ("loss out read-only", "loss", np.full((), SENTINEL), None, ValueError, "read-only"),
    ("pair not a tuple", "backward", np.full((N, D), SENTINEL), 1.0, TypeError, "tuple of 2"),
    ("pair too short", "backward", (np.full((N, D), SENTINEL),), 1.0, TypeError, "tuple of 2"),
    ("pair dx2 shape", "backward", (np.full((N, D), SENTINEL), np.full((D, N), SENTINEL)), 1.0,
     ValueError, "(33, 7)"),
    ("triple dx1 dtype", "fused",
     (np.full((), SENTINEL), np.full((N, D), SENTINEL, np.float16), np.full((N, D), SENTINEL)),
     None, TypeError, "float16"),
    ("grad array for mean", "backward", None, np.ones(N), ValueError, "(7,)"),
    ("grad bool", "backward", None, True, TypeError, "True"),
    ("grad list", "fused", None, [1.0], TypeError, "list"),
    ("grad str", "backward", None, "1", TypeError, "str"),
]


@pytest.mark.parametrize("name, entry, out, grad, error, text", BAD_OUT_OR_GRAD,
                         ids=[b[0] for b in BAD_OUT_OR_GRAD])
def test_bad_out_or_grad_raises_and_leaves_buffers_untouched(name, entry, out, grad, error, text):
    if name == "loss out read-only":
        out.flags.writeable = False
    args = _good()
    with pytest.raises(error) as info:
        if entry == "loss":
            F.cosine_embedding_loss(**args, out=out)
        elif entry == "backward":
            F.cosine_embedding_loss_backward(grad, **args, out=out)
        else:
            F.cosine_embedding_loss_fused(**args, grad=grad, out=out)
    assert text in str(info.value), str(info.value)
    for buffer in out if isinstance(out, tuple) else [] if out is None else [out]:
        assert (np.asarray(buffer) == SENTINEL).all()


def test_grad_shape_for_reduction_none():
    x1, x2, y = _inputs(N, D)
    with pytest.raises(ValueError, match=r"shape \(7,\)"):
        F.cosine_embedding_loss_backward(1.0, x1, x2, y, reduction="none")
    with pytest.raises(ValueError, match=r"\(6,\)"):
        F.cosine_embedding_loss_backward(np.ones(6), x1, x2, y, reduction="none")


@pytest.mark.parametrize("entry", ["loss", "backward", "fused"])
@pytest.mark.parametrize("name", ["x1", "x2", "target"])
def test_a_torch_tensor_is_refused_with_the_way_to_cek_torch(entry, name):
    torch = pytest.importorskip("torch")
    args = _good()
    args[name] = torch.from_numpy(args[name])
    out = _sentinel_out()
    with pytest.raises(TypeError, match=rf"{name} is a torch\.Tensor: .*cek\.torch") as info:
        _call(entry, args, out)
    assert "numpy" in str(info.value), str(info.value)  # what these functions take
    for buffer in out:
        assert (buffer == SENTINEL).all()


def test_a_bfloat16_tensor_is_refused_with_the_way_to_cek_torch():
    torch = pytest.importorskip("torch")
    x = torch.ones(N, D, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"x1 is a torch\.Tensor: .*cek\.torch"):
        F.cosine_embedding_loss(x, x, torch.ones(N), dtype="bfloat16")


def test_import_cek_does_not_import_torch_or_cupy():
    code = ("import sys, cek, cek.functional, cek.cpu, cek.validate; "
            "assert 'torch' not in sys.modules, 'torch'; assert 'cupy' not in sys.modules, 'cupy'")
    subprocess.run([sys.executable, "-c", code], check=True)


# -- gpu tier: the CuPy path -------------------------------------------------------------------


@pytest.mark.parametrize("where", [
    "stand-in", pytest.param("gpu", marks=[pytest.mark.gpu, needs_gpu])])
def test_cupy_bad_labels_name_the_first_bad_row(monkeypatch, where):
    """On CuPy arrays as on NumPy ones; on the stand-in for CuPy in the cpu tier too, so that an
    expectation about the CuPy path is checked before it meets a GPU."""
    cupy = fake_cupy.install(monkeypatch).cupy if where == "stand-in" else gpu.require_cupy()
    x1, x2, y = _inputs(7, 66, np.float32)
    c1, c2, cy = (cupy.asarray(a) for a in (x1, x2, y))
    # The labels cycle 1, -1, 0, 2: row 2 is the first that is not +-1.
    with pytest.raises(ValueError, match=r"^target\[2\] = 0\.0: "):
        F.cosine_embedding_loss(c1, c2, cy, validate_target=True)
    bad = cupy.where(cy == -1, -1.0, 1.0).astype(cupy.float32)
    bad[3] = 2
    with pytest.raises(ValueError, match=r"^target\[3\] = 2\.0: "):
        F.cosine_embedding_loss(c1, c2, bad, validate_target=True)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1, 33, 256, 257, 769, 4097, 16384, 16385, 70000])
def test_cupy_matches_reference(d, dtype):
    cupy = gpu.require_cupy()
    x1, x2, y = _inputs(7, d, dtype, seed=d)
    c1, c2, cy = (cupy.asarray(a) for a in (x1, x2, y))
    for reduction in REDUCTIONS:
        grad = _grad_for(reduction, 7, dtype)
        cgrad = cupy.asarray(grad) if reduction == "none" else grad
        loss, dx1, dx2 = _expected(x1, x2, y, 0.25, reduction, grad)
        got = F.cosine_embedding_loss(c1, c2, cy, 0.25, reduction)
        assert isinstance(got, cupy.ndarray) and got.dtype == dtype and got.shape == np.shape(loss)
        # float16 and float64 run as float32 for now: float32's tolerances, then the cast.
        tol = dtype if dtype == np.float16 else np.float32
        _close(got.get(), loss, tol, "loss")
        f_loss, f1, f2 = F.cosine_embedding_loss_fused(c1, c2, cy, 0.25, reduction, cgrad)
        g1, g2 = F.cosine_embedding_loss_backward(cgrad, c1, c2, cy, 0.25, reduction)
        _close(f_loss.get(), loss, tol, "loss")
        for got_dx, want in ((f1, dx1), (f2, dx2), (g1, dx1), (g2, dx2)):
            assert got_dx.dtype == dtype
            _close(got_dx.get(), want, tol, "grad")


@pytest.mark.gpu
@needs_gpu
def test_cupy_edge_cases():
    cupy = gpu.require_cupy()
    x1, x2, y = _inputs(7, 66, np.float32)
    c1, c2, cy = (cupy.asarray(a) for a in (x1, x2, y))
    # Non-contiguous views give what their contiguous copies give.
    t1 = cupy.asfortranarray(c1)
    for a, b in zip(F.cosine_embedding_loss_fused(t1, c2[:, ::1], cy),
                    F.cosine_embedding_loss_fused(c1, c2, cy)):
        cupy.testing.assert_array_equal(a, b)
    # Deterministic: the same bits every run, for every reduction.
    for reduction in REDUCTIONS:
        first = F.cosine_embedding_loss_fused(c1, c2, cy, 0.1, reduction)
        for _ in range(3):
            for a, b in zip(first, F.cosine_embedding_loss_fused(c1, c2, cy, 0.1, reduction)):
                assert a.get().tobytes() == b.get().tobytes()
    # A 0-d CuPy grad equals the same number.
    a = F.cosine_embedding_loss_backward(cupy.asarray(2.0), c1, c2, cy)
    b = F.cosine_embedding_loss_backward(2.0, c1, c2, cy)
    for u, v in zip(a, b):
        cupy.testing.assert_allclose(u, v, rtol=1e-6, atol=0)
    # float64 labels that round to 1.0 in float32 are still "other" labels.
    y64 = cupy.full(7, 1 + 1e-12)
    assert float(F.cosine_embedding_loss(c1.astype(cupy.float64), c2.astype(cupy.float64), y64,
                                         reduction="sum")) == 0.0
    # N = 0, D too long, NumPy mixed with CuPy, bad labels: no launch, clear errors.
    empty = cupy.zeros((0, 4), cupy.float32)
    assert cupy.isnan(F.cosine_embedding_loss(empty, empty, cupy.zeros(0, cupy.float32)))
    too_long = split.max_n_dim("f32") + 1  # 2**22 + 1: no kernel, split or not
    long_row = cupy.ones((1, too_long), cupy.float32)
    with pytest.raises(ValueError, match=str(too_long)):
        F.cosine_embedding_loss(long_row, long_row, cupy.ones(1, cupy.float32))
    with pytest.raises(TypeError, match="cupy"):
        F.cosine_embedding_loss(x1, c2, cy)
    # out buffers: written in place (float32) or through a cast (float16); sentinel kept on error.
    out = (cupy.full(7, np.nan, cupy.float32), cupy.full_like(c1, np.nan),
           cupy.full_like(c1, np.nan))
    got = F.cosine_embedding_loss_fused(c1, c2, cy, 0.0, "none", out=out)
    assert all(a is b for a, b in zip(got, out))
    want = F.cosine_embedding_loss_fused(c1, c2, cy, 0.0, "none")
    for a, b in zip(out, want):
        cupy.testing.assert_array_equal(a, b)
    sentinel = cupy.full(7, SENTINEL, cupy.float32)
    with pytest.raises(ValueError):
        F.cosine_embedding_loss(c1, c2, cy, reduction="none", margin=float("inf"), out=sentinel)
    assert bool((sentinel == SENTINEL).all())


def test_out_buffers_that_share_memory_are_refused_and_left_untouched():
    rng = np.random.default_rng(5)
    x1, x2 = rng.standard_normal((2, 4, 6)).astype(np.float32)
    y = np.array([1.0, -1.0, 1.0, -1.0], np.float32)
    loss = np.full(4, 7.0, np.float32)
    shared = np.full((4, 6), 7.0, np.float32)
    with pytest.raises(ValueError, match="share memory"):
        F.cosine_embedding_loss_fused(x1, x2, y, reduction="none", out=(loss, shared, shared))
    assert (loss == 7).all() and (shared == 7).all()


# -- bfloat16 as uint16 bits (dtype="bfloat16") ------------------------------------------------


def _bf16_inputs(n, d, seed=0):
    """_inputs rounded to bfloat16 bits, and the float32 arrays of the same values."""
    x1, x2, y = _inputs(n, d, np.float32, seed)
    b1, b2 = dtypes.from_float(x1, "bf16"), dtypes.from_float(x2, "bf16")
    return b1, b2, y, dtypes.widen(b1, "bf16"), dtypes.widen(b2, "bf16")


def _entries(x1, x2, y, margin, reduction, grad, **kw):
    """(loss,), (dx1, dx2) and (loss, dx1, dx2) from the three entry points."""
    return ((F.cosine_embedding_loss(x1, x2, y, margin, reduction, **kw),),
            F.cosine_embedding_loss_backward(grad, x1, x2, y, margin, reduction, **kw),
            F.cosine_embedding_loss_fused(x1, x2, y, margin, reduction, grad, **kw))


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("d", [1, 33, 769, 4097])
def test_bfloat16_is_the_float32_path_on_its_values_rounded_once(monkeypatch, d, native):
    """The same float32 arithmetic on the same values, then cek.dtypes.from_float: bitwise, NaN
    and Inf rows, huge rows and the reductions included. An upstream gradient array is a value
    of the inputs' type too (rounded to bfloat16 once, as torch's gradient of a bfloat16 loss
    is), which the float32 path is given as such."""
    monkeypatch.setenv("CEK_CPU_NATIVE", native)
    b1, b2, y, w1, w2 = _bf16_inputs(7, d, seed=d)
    b1[1, 0] = dtypes.from_float(np.float32(np.nan), "bf16")
    b2[2, d // 2] = dtypes.from_float(np.float32(np.inf), "bf16")
    b1[3] = dtypes.from_float(w1[3] * np.float32(1e30), "bf16")
    w1, w2 = dtypes.widen(b1, "bf16"), dtypes.widen(b2, "bf16")
    for reduction in REDUCTIONS:
        grad = _grad_for(reduction, 7, np.float32)
        got = _entries(b1, b2, y, 0.1, reduction, grad, dtype="bfloat16")
        if isinstance(grad, np.ndarray):
            grad = dtypes.widen(dtypes.from_float(grad, "bf16"), "bf16")
        want = _entries(w1, w2, y, 0.1, reduction, grad)
        for got_entry, want_entry in zip(got, want):
            for bits, values in zip(got_entry, want_entry):
                assert bits.dtype == np.uint16 and bits.shape == values.shape
                np.testing.assert_array_equal(bits, dtypes.from_float(values, "bf16"))


@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("d", DIMS)
def test_bfloat16_matches_reference(d, n):
    b1, b2, y, w1, w2 = _bf16_inputs(n, d, seed=d * 10 + n)
    for i, reduction in enumerate(REDUCTIONS):
        margin = MARGINS[(d + i) % 3]
        grad = _grad_for(reduction, n, np.float32)
        (loss, dx1, dx2), (m1, m2) = expected_and_sizes(w1, w2, y, margin, reduction, grad)
        (f_loss,), (g1, g2), (h_loss, h1, h2) = _entries(b1, b2, y, margin, reduction, grad,
                                                         dtype="bfloat16")
        assert f_loss.shape == np.shape(loss) and isinstance(f_loss, np.ndarray)
        for got in (f_loss, h_loss):
            assert_bf16_close(got, loss, "loss")
        for got, want, size in ((g1, dx1, m1), (g2, dx2, m2), (h1, dx1, m1), (h2, dx2, m2)):
            assert got.shape == b1.shape
            assert_bf16_close(got, want, "grad", size)


def test_bfloat16_out_buffers_are_bits_written_and_returned():
    b1, b2, y, _, _ = _bf16_inputs(N, D)
    want = F.cosine_embedding_loss_fused(b1, b2, y, 0.2, "none", dtype="bfloat16")
    out = tuple(np.full(a.shape, 0x7FC0, np.uint16) for a in want)  # NaN bits
    got = F.cosine_embedding_loss_fused(b1, b2, y, 0.2, "none", dtype="bfloat16", out=out)
    assert all(a is b for a, b in zip(got, out))
    for a, b in zip(out, want):
        np.testing.assert_array_equal(a, b)
    pair = (np.full_like(b1, 0x7FC0), np.full_like(b1, 0x7FC0))
    F.cosine_embedding_loss_backward(np.ones(N), b1, b2, y, 0.2, "none", dtype="bfloat16",
                                     out=pair)
    np.testing.assert_array_equal(pair[0], want[1])
    mean = np.full((), 0x7FC0, np.uint16)
    assert F.cosine_embedding_loss(b1, b2, y, 0.2, dtype="bfloat16", out=mean) is mean
    assert mean != 0x7FC0
    np.testing.assert_array_equal(mean, F.cosine_embedding_loss(b1, b2, y, 0.2, dtype="bfloat16"))


BF16_BAD = [
    ("float32 inputs", {"x1": np.ones((N, D), np.float32), "x2": np.ones((N, D), np.float32)},
     TypeError, "uint16 array of bfloat16 bits, got float32"),
    ("int16 x2", {"x2": np.ones((N, D), np.int16)}, TypeError, "x2 as a uint16 array"),
    ("list x1", {"x1": [[1] * D] * N}, TypeError, "got list"),
    ("masked x1", {"x1": np.ma.masked_array(np.ones((N, D), np.uint16), mask=True)}, TypeError,
     "x1 is a numpy.ma.MaskedArray"),
    ("dtype name", {"dtype": "bf16"}, ValueError, "dtype must be None or 'bfloat16'"),
    ("dtype object", {"dtype": np.float16}, ValueError, "dtype must be None or 'bfloat16'"),
    ("x2 shape", {"x2": np.ones((N, D + 1), np.uint16)}, ValueError, "(7, 34)"),
    ("margin nan", {"margin": float("nan")}, ValueError, "nan"),
    ("reduction", {"reduction": "avg"}, ValueError, "'avg'"),
    ("bad label", {"target": _bad_label(), "validate_target": True}, ValueError, "target[4]"),
]


@pytest.mark.parametrize("entry", ["loss", "backward", "fused"])
@pytest.mark.parametrize("name, change, error, text", BF16_BAD, ids=[b[0] for b in BF16_BAD])
def test_bfloat16_bad_input_raises_and_leaves_out_untouched(entry, name, change, error, text):
    b1, b2, y, _, _ = _bf16_inputs(N, D)
    args = {"x1": b1, "x2": b2, "target": y, "dtype": "bfloat16", **change}
    out = (np.full((), 12345, np.uint16), np.full((N, D), 12345, np.uint16),
           np.full((N, D), 12345, np.uint16))
    with pytest.raises(error) as info:
        _call(entry, args, out)
    assert text in str(info.value), str(info.value)
    for buffer in out:
        assert (buffer == 12345).all()


def test_bfloat16_out_buffers_must_be_bits():
    b1, b2, y, _, _ = _bf16_inputs(N, D)
    loss_out = np.full((), SENTINEL, np.float32)  # the loss is bits too, not float32
    with pytest.raises(TypeError, match="must have dtype uint16 like x1, got float32"):
        F.cosine_embedding_loss(b1, b2, y, dtype="bfloat16", out=loss_out)
    assert loss_out == SENTINEL


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_bfloat16_on_cupy_arrays_runs_the_bf16_kernels(monkeypatch, reduction):
    """On the stand-in for CuPy: the bfloat16 kernels, whose results match the reference."""
    standin = fake_cupy.install(monkeypatch)
    b1, b2, y, w1, w2 = _bf16_inputs(N, D, seed=3)
    grad = _grad_for(reduction, N, np.float32)
    cgrad = standin.array(grad) if reduction == "none" else grad
    (loss, dx1, dx2), (m1, m2) = expected_and_sizes(w1, w2, y, 0.25, reduction, grad)
    got = F.cosine_embedding_loss_fused(*(standin.array(a) for a in (b1, b2, y)), 0.25,
                                        reduction, cgrad, dtype="bfloat16")
    reduce = [] if reduction == "none" else ["cosine_embedding_loss_reduce__bf16__1024"]
    assert standin.ids() == ["cosine_embedding_loss_fused__bf16__64", *reduce]
    assert all(type(a) is fake_cupy.DeviceArray and a.dtype == np.uint16 for a in got)
    assert_bf16_close(np.asarray(got[0]), loss, "loss")
    for bits, want, size in zip(got[1:], (dx1, dx2), (m1, m2)):
        assert_bf16_close(np.asarray(bits), want, "grad", size)
