"""The NumPy path (cek.cpu through cek.functional): huge rows, bounded memory, float16 and
bfloat16 conversions, bfloat16 rows against the reference, bad input it must refuse, warnings it
must not leak. bfloat16 arrays are uint16 bits (cek.functional's dtype="bfloat16")."""

import tracemalloc
import warnings

import numpy as np
import pytest

from cek import cpu, dtypes
from cek import functional as F
from oracle import (GLUE_TOLERANCES, NUMPY_TOLERANCES, assert_bf16_close, expected,
                    expected_and_sizes)

DTYPES = [np.float16, np.float32, np.float64]
BF16_MAX = float(dtypes.widen(np.array(0x7F7F, np.uint16), "bf16"))  # 3.39e38


def _stored(values, dtype):
    """float values in `dtype`'s arrays: a NumPy dtype, or "bf16" for bits (from_float)."""
    if dtype == "bf16":
        return dtypes.from_float(np.asarray(values, np.float32), "bf16")
    return np.asarray(values).astype(dtype)


def _values(array, dtype):
    return dtypes.to_float64(array, "bf16") if dtype == "bf16" else array.astype(np.float64)


def _largest(dtype):
    return BF16_MAX if dtype == "bf16" else float(np.finfo(dtype).max)


def _kw(dtype):
    """cek.functional's keyword for `dtype`'s arrays."""
    return {"dtype": "bfloat16"} if dtype == "bf16" else {}


# -- huge rows ---------------------------------------------------------------------------------


def _huge_rows(dtype, d, seed=0):
    """Rows whose largest element is the dtype's largest finite value (and a few sizes between),
    next to ordinary rows; x1 and x2 scaled apart. Returns x1, x2, y and per row the exponents
    e1, e2 such that x * 2^-e is a copy the float64 reference computes exactly enough."""
    rng = np.random.default_rng(seed)
    top = _largest(dtype)
    s1 = np.minimum([top, top, top / 3, 1e19, 0.9, top, 2.0, 0.75], top)
    s2 = np.minimum([top, 0.9, top / 3, 1e19, 0.9, top, top, 0.75], top)  # some pairs unequal
    n = len(s1)
    x1 = rng.standard_normal((n, d))
    x2 = rng.uniform(-1, 1, (n, 1)) * x1 + 0.3 * rng.standard_normal((n, d))
    x1 = x1 / np.abs(x1).max(axis=1, keepdims=True) * s1[:, None]
    x2 = x2 / np.abs(x2).max(axis=1, keepdims=True) * s2[:, None]
    # The largest element rounds to at most top (to nearest, from at most top).
    x1, x2 = _stored(x1, dtype), _stored(x2, dtype)
    assert np.isfinite(_values(x1, dtype)).all() and np.isfinite(_values(x2, dtype)).all()
    y = np.array([1, -1, 1, -1, 1, -1, 1, -1], np.float64 if dtype == "bf16" else dtype)
    # Copies brought down to max|x| ~ 2^200 only: there EPS is still 1e-120 of a squared norm,
    # as it is of the row's own, and float64 squares them without overflow.
    e = [np.maximum(0, np.frexp(np.abs(_values(x, dtype)).max(axis=1))[1] - 200)
         for x in (x1, x2)]
    return x1, x2, y, e[0], e[1]  # rows below 2^200 are their own copies


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [1, 33, 769])
def test_rows_up_to_the_largest_finite_values_match_the_reference(dtype, d):
    x1, x2, y, e1, e2 = _huge_rows(dtype, d, seed=d)
    grad = np.linspace(0.5, 2.0, len(y)).astype(dtype)
    # The reference on copies scaled by powers of two (exact): c is scale-free, EPS is far below
    # these rows' norms (or the copies equal the rows), and dx1 scales as 1/x1.
    s1 = np.ldexp(np.asarray(x1, np.float64), -e1[:, None])
    s2 = np.ldexp(np.asarray(x2, np.float64), -e2[:, None])
    loss, dx1, dx2 = expected(s1, s2, y, -0.2, "none", grad)
    got, g1, g2 = F.cosine_embedding_loss_fused(x1, x2, y, -0.2, "none", grad)
    assert np.isfinite(got).all() and np.isfinite(g1).all() and np.isfinite(g2).all()
    rtol, atol = NUMPY_TOLERANCES[dtype]["loss"]
    np.testing.assert_allclose(got.astype(np.float64), loss, rtol=rtol, atol=atol)
    # Scaled back up; a gradient that is subnormal in the dtype is only as exact as its step.
    rtol, atol = NUMPY_TOLERANCES[dtype]["grad"]
    step = dtypes.smallest_step(dtypes.name_of(dtype))
    for got_dx, want, e in ((g1, dx1, e1), (g2, dx2, e2)):
        scaled = np.ldexp(got_dx.astype(np.float64), e[:, None])
        bound = rtol * np.abs(want) + atol + np.ldexp(step, e[:, None])
        assert (np.abs(scaled - want) <= bound).all(), np.abs(scaled - want).max()


@pytest.mark.parametrize("d", [1, 33, 769])
def test_bfloat16_rows_up_to_the_largest_finite_values_match_the_reference(d):
    x1, x2, y, e1, e2 = _huge_rows("bf16", d, seed=d)
    grad = np.linspace(0.5, 2.0, len(y))
    s1 = np.ldexp(_values(x1, "bf16"), -e1[:, None])  # as in the test above
    s2 = np.ldexp(_values(x2, "bf16"), -e2[:, None])
    (loss, dx1, dx2), (m1, m2) = expected_and_sizes(s1, s2, y, -0.2, "none", grad)
    got, g1, g2 = F.cosine_embedding_loss_fused(x1, x2, y, -0.2, "none", grad, dtype="bfloat16")
    assert got.dtype == g1.dtype == g2.dtype == np.uint16
    assert np.isfinite(_values(got, "bf16")).all()
    assert np.isfinite(_values(g1, "bf16")).all() and np.isfinite(_values(g2, "bf16")).all()
    assert_bf16_close(got, loss, "loss")
    # Scaled back up: 2^e times the bits' values, exactly (their subnormal step scales too).
    for got_dx, want, size, e in ((g1, dx1, m1, e1), (g2, dx2, m2, e2)):
        scaled = np.ldexp(_values(got_dx, "bf16"), e[:, None])
        rtol, atol = GLUE_TOLERANCES["bf16"]["grad"]
        bound = rtol * np.abs(want) + atol * size + np.ldexp(dtypes.smallest_step("bf16"),
                                                              e[:, None])
        assert (np.abs(scaled - want) <= bound).all(), np.abs(scaled - want).max()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bf16"])
def test_a_huge_row_leaves_ordinary_rows_bitwise_alone(dtype):
    rng = np.random.default_rng(3)
    x1, x2 = rng.standard_normal((2, 40, 64))
    y = np.where(rng.random(40) < 0.5, 1, -1).astype(np.float32)
    plain = F.cosine_embedding_loss_fused(_stored(x1, dtype), _stored(x2, dtype), y, 0.1,
                                          "none", **_kw(dtype))
    x1[7] *= _largest(dtype) / np.abs(x1[7]).max()
    mixed = F.cosine_embedding_loss_fused(_stored(x1, dtype), _stored(x2, dtype), y, 0.1,
                                          "none", **_kw(dtype))
    others = np.arange(40) != 7
    for a, b in zip(plain, mixed):
        np.testing.assert_array_equal(a[others], b[others])
    assert np.isfinite(_values(mixed[0][7], dtype))
    assert np.isfinite(_values(mixed[1][7], dtype)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bf16"])
def test_a_row_with_an_inf_or_nan_stays_nan_among_huge_rows(dtype):
    x1 = np.full((3, 8), _largest(dtype))
    x1[0, 3] = np.inf
    x1[2, 5] = np.nan
    x1 = _stored(x1, dtype)
    loss, dx1, dx2 = (_values(a, dtype) for a in F.cosine_embedding_loss_fused(
        x1, x1.copy(), np.ones(3), 0.0, "none", **_kw(dtype)))
    for row in (0, 2):
        assert np.isnan(loss[row]) and np.isnan(dx1[row]).all() and np.isnan(dx2[row]).all()
    assert abs(loss[1]) < 1e-6 and np.isfinite(dx1[1]).all()


# -- float16 conversions -----------------------------------------------------------------------


def test_half_to_float_gives_numpys_value_for_every_float16():
    every = np.arange(2**16, dtype=np.uint16).view(np.float16)
    got = dtypes.half_to_float(every, np.empty(every.shape, np.float32))
    want = every.astype(np.float32)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_float_to_half_rounds_as_numpy_over_the_whole_float32_range():
    # Every 4099th bit pattern (all exponents, both signs), plus the rounding edges.
    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    edges = np.array([65504, 65519.996, 65520, 65536, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25,
                      2.0**-14 - 2.0**-25, 1 + 2.0**-11, 1 + 3 * 2.0**-11], np.float32)
    values = np.concatenate([bits.view(np.float32), edges, -edges])
    got = dtypes.float_to_half(values, np.empty(values.shape, np.float16),
                               (np.empty(values.shape, np.uint32),) * 1
                               + (np.empty(values.shape, np.uint32),))
    with np.errstate(over="ignore"):
        want = values.astype(np.float16)
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), values[~same][:5]


def test_bfloat16_widening_and_rounding_in_place_match_cek_dtypes():
    every = np.arange(2**16, dtype=np.uint16)
    wide = dtypes.bfloat16_to_float(every, np.empty(every.shape, np.float32))
    assert np.array_equal(wide.view(np.uint32), dtypes.widen(every, "bf16").view(np.uint32))
    # Every 4099th float32 bit pattern (all exponents, both signs, NaNs), ties, overflow.
    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0x3F808000, 0x3F818000, 0x7F7F7FFF, 0x7F7F8000, 0x7F800001, 0x7FFFFFFF,
                      0x00008000, 0x00018000], np.uint32)
    values = np.concatenate([bits, edges, edges | 0x80000000]).view(np.float32)
    scratch = (np.empty(values.shape, np.uint32), np.empty(values.shape, np.uint32))
    got = dtypes.float_to_bfloat16(values, np.empty(values.shape, np.uint16), scratch)
    np.testing.assert_array_equal(got, dtypes.from_float(values, "bf16"))


# -- memory ------------------------------------------------------------------------------------


def _peaks(x1, x2, y, **kw):
    """tracemalloc's peak of a fused call with out= buffers, and of one without."""
    out = (np.empty((), x1.dtype), np.empty_like(x1), np.empty_like(x2))
    tracemalloc.start()
    try:
        F.cosine_embedding_loss_fused(x1, x2, y, 0.0, "mean", out=out, **kw)
        _, with_out = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        F.cosine_embedding_loss_fused(x1, x2, y, 0.0, "mean", **kw)
        _, allocating = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return with_out, allocating


def _bound(n):
    """The promise in docs/cpu.md: 7 temporaries of a block per thread, per-row values (loss,
    two squared norms, labels: at most 25 bytes a row in float64), and at most 64 MiB in all."""
    bound = cpu.MAX_THREADS * 7 * cpu.BLOCK_BYTES + 32 * n
    assert bound <= 64 * 2**20
    return bound


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("dtype", [*DTYPES, "bf16"])
def test_temporaries_stay_bounded_whatever_the_row_count(monkeypatch, dtype, native):
    monkeypatch.setenv("CEK_CPU_NATIVE", native)  # the compiled rows, then the NumPy code
    n, d = 8192, 512  # 16 MiB per float32 input
    rng = np.random.default_rng(0)
    x1, x2 = _stored(rng.standard_normal((2, n, d)), dtype)
    with_out, allocating = _peaks(x1, x2, np.ones(n), **_kw(dtype))
    assert with_out <= _bound(n), with_out / 2**20
    assert allocating <= _bound(n) + x1.nbytes + x2.nbytes, allocating / 2**20


@pytest.mark.parametrize("native", ["1", "0"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bf16"])
def test_huge_rows_are_recomputed_in_bounded_blocks(monkeypatch, dtype, native):
    # Every row huge: x * 1e30 (float64: 1e200) squares past the accumulation dtype's sqrt(max).
    # Copying every huge row at once took 160.5 MiB for a 16 MiB float32 input.
    monkeypatch.setenv("CEK_CPU_NATIVE", native)
    n, d = 8192, 512
    rng = np.random.default_rng(0)
    scale = 1e200 if dtype == np.float64 else 1e30
    x1, x2 = _stored(rng.standard_normal((2, n, d)) * scale, dtype)
    y = np.where(rng.random(n) < 0.5, 1.0, -1.0)
    with_out, allocating = _peaks(x1, x2, y, **_kw(dtype))
    assert with_out <= _bound(n), with_out / 2**20
    assert allocating <= _bound(n) + x1.nbytes + x2.nbytes, allocating / 2**20
    # And they were recomputed: the loss of a few rows against the reference on copies / scale.
    rows = [0, 4097, n - 1]
    loss = F.cosine_embedding_loss(x1[rows], x2[rows], y[rows], 0.0, "none", **_kw(dtype))
    want = expected(_values(x1[rows], dtype) / scale, _values(x2[rows], dtype) / scale, y[rows],
                    0.0, "none", 1.0)[0]
    if dtype == "bf16":
        assert_bf16_close(loss, want, "loss")
    else:
        rtol, atol = NUMPY_TOLERANCES[dtype]["loss"]
        np.testing.assert_allclose(loss, want, rtol=rtol, atol=atol)


# -- bad input and warnings --------------------------------------------------------------------


@pytest.mark.parametrize("which", ["x1", "x2", "target", "grad", "out"])
def test_a_masked_array_is_refused_not_read_through_its_mask(which):
    x = np.ones((3, 4))
    args = {"x1": x, "x2": x.copy(), "target": np.ones(3), "grad": np.ones(3),
            "out": (np.empty(3), np.empty_like(x), np.empty_like(x))}
    masked = np.ma.masked_array(np.asarray(args[which] if which != "out" else args["out"][1]),
                                mask=True)
    if which == "out":
        args["out"] = (args["out"][0], masked, args["out"][2])
        name = "dx1"
    else:
        args[which], name = masked, which
    with pytest.raises(TypeError, match=f"{name} is a numpy.ma.MaskedArray"):
        F.cosine_embedding_loss_fused(args["x1"], args["x2"], args["target"], 0.0, "none",
                                      args["grad"], out=args["out"])


@pytest.mark.parametrize("dtype", [*DTYPES, "bf16"])
@pytest.mark.parametrize("margin, grad", [(1e300, 1.0), (-1e300, 1.0), (0.0, 1e300),
                                          (0.0, -1e300), (1e38, 1e38),
                                          pytest.param(0.5, 2**1000, id="0.5-2^1000")])
def test_huge_margins_and_grads_warn_nothing(dtype, margin, grad):
    x1, x2 = np.random.default_rng(0).standard_normal((2, 5, 8))
    x1[0, 0] = np.inf
    x1, x2 = _stored(x1, dtype), _stored(x2, dtype)
    y = np.array([1, -1, -1, 1, 0], np.float32)
    kw = _kw(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for reduction in ("none", "mean", "sum"):
            g = np.full(5, float(grad)) if reduction == "none" else grad
            F.cosine_embedding_loss(x1, x2, y, margin, reduction, **kw)
            F.cosine_embedding_loss_backward(g, x1, x2, y, margin, reduction, **kw)
            F.cosine_embedding_loss_fused(x1, x2, y, margin, reduction, g, **kw)


@pytest.mark.parametrize("what", ["margin", "grad"])
def test_an_int_beyond_float_is_a_value_error(what):
    x = np.ones((2, 3))
    huge = 2**2000
    with pytest.raises(ValueError, match=f"{what} must .*\\(603 characters\\)"):
        if what == "margin":
            F.cosine_embedding_loss(x, x, np.ones(2), huge)
        else:
            F.cosine_embedding_loss_backward(huge, x, x, np.ones(2))


@pytest.mark.parametrize("dtype", [*DTYPES, "bf16"])
def test_no_rows_and_one_block_per_thread_give_the_same_rows(dtype):
    bf16 = dtype == "bf16"
    empty = _stored(np.zeros((0, 4)), dtype)
    loss, dx1, dx2 = cpu.rows(empty, empty, np.zeros(0), 0.0, 1.0, bfloat16=bf16)
    assert loss.shape == (0,) and dx1.shape == dx2.shape == (0, 4)
    # Many blocks over several threads against one row at a time: the same bits.
    rng = np.random.default_rng(5)
    x1, x2 = _stored(rng.standard_normal((2, 3000, 200)), dtype)
    y = np.where(rng.random(3000) < 0.5, 1, -1)
    whole = cpu.rows(x1, x2, y, 0.1, 0.5, bfloat16=bf16)
    for i in (0, 1234, 2999):
        one = cpu.rows(x1[i:i + 1], x2[i:i + 1], y[i:i + 1], 0.1, 0.5, bfloat16=bf16)
        for a, b in zip(whole, one):
            np.testing.assert_array_equal(a[i:i + 1], b)
