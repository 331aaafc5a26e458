"""cpu tier: the compiled CPU rows (cek/cpu_native.cpp) give the NumPy code's bits, and cek falls
back to the NumPy code when they cannot be built.

The NumPy code is checked against the float64 reference in test_cpu_path.py and
test_functional.py; bitwise equality here carries that check over to the compiled rows, and
covers what tolerances cannot: the order of every sum, the rounding of every product.
"""

import numpy as np
import pytest
from oracle import assert_close, expected

from cek import cpu, cpu_native, dtypes
from cek import functional as F
from cek.emulate import build

DTYPES = [np.float16, np.float32, np.float64, "bf16"]  # bf16: uint16 bits, cpu.rows(bfloat16=True)
# NumPy's pairwise sum: under 8 (one running sum), up to 128 (8 partial sums and a tail), longer
# (split at a multiple of 8), and a float16 row whose length is not a multiple of 8 conversions.
WIDTHS = [1, 3, 7, 8, 9, 15, 16, 17, 127, 128, 129, 135, 257, 1000, 4097]


@pytest.fixture
def native(monkeypatch):
    monkeypatch.setenv("CEK_CPU_NATIVE", "1")
    if cpu_native.unavailable_reason() is not None:
        pytest.fail(f"the compiled CPU rows did not build: {cpu_native.unavailable_reason()}")


def stored(values, dtype):
    """float values in `dtype`'s arrays (bf16: its bits, rounded by cek.dtypes.from_float)."""
    if dtype == "bf16":
        return dtypes.from_float(np.asarray(values, np.float32), "bf16")
    return np.asarray(values).astype(dtype)


def both(monkeypatch, *args, **kwargs):
    """cpu.rows compiled, then through NumPy; uint16 inputs are bfloat16 bits."""
    kwargs.setdefault("bfloat16", args[0].dtype == np.uint16)
    monkeypatch.setenv("CEK_CPU_NATIVE", "1")
    compiled = cpu.rows(*args, **kwargs)
    monkeypatch.setenv("CEK_CPU_NATIVE", "0")
    numpy = cpu.rows(*args, **kwargs)
    return compiled, numpy


def assert_same_bits(compiled, numpy):
    for got, want, what in zip(compiled, numpy, ("loss", "dx1", "dx2")):
        assert (got is None) == (want is None), what
        if got is not None:
            assert got.dtype == want.dtype and got.shape == want.shape, what
            differ = got.view(np.uint8) != want.view(np.uint8)
            assert not differ.any(), f"{what}: {np.argwhere(differ)[:3].tolist()}"


def awkward_rows(dtype, d, rng):
    """37 rows of mixed scales with a NaN, an Inf, a zero row and (float32/64) a huge row."""
    n = 37
    scale = rng.choice([1e-3, 1.0, 100.0], size=(2, n, 1))
    x1, x2 = rng.standard_normal((2, n, d)) * scale
    x1[3, 0] = np.nan
    x2[4, d // 2] = np.inf
    x1[5] = 0
    if dtype != np.float16:
        x1[6] *= 1e200 if dtype == np.float64 else 1e30
    y = rng.choice([1.0, -1.0, 0.0, 2.0, np.nan], size=n)
    return stored(x1, dtype), stored(x2, dtype), y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", WIDTHS)
def test_compiled_rows_are_the_numpy_codes_bits(native, monkeypatch, dtype, d):
    rng = np.random.default_rng(d)
    x1, x2, y = awkward_rows(dtype, d, rng)
    for g in (rng.standard_normal(len(y)), 0.5):
        assert_same_bits(*both(monkeypatch, x1, x2, y, 0.1, g))
    assert_same_bits(*both(monkeypatch, x1, x2, y, -0.3, want_grads=False))
    assert_same_bits(*both(monkeypatch, x1, x2, y, 0.0, 2.0, want_loss=False))


@pytest.mark.parametrize("dtype", DTYPES)
def test_many_threads_and_caller_buffers_give_the_same_bits(native, monkeypatch, dtype):
    rng = np.random.default_rng(1)
    n, d = 5000, 300  # several threads' worth of rows
    x1, x2 = stored(rng.standard_normal((2, n, d)), dtype)
    y = np.where(rng.random(n) < 0.5, 1, -1)
    g = rng.standard_normal(n)
    bf16 = dtype == "bf16"
    dx1, dx2 = stored(np.full(x1.shape, np.nan), dtype), stored(np.full(x2.shape, np.nan), dtype)
    monkeypatch.setenv("CEK_CPU_NATIVE", "1")
    into = cpu.rows(x1, x2, y, 0.2, g, dx1=dx1, dx2=dx2, bfloat16=bf16)
    assert into[1] is dx1 and into[2] is dx2
    monkeypatch.setenv("CEK_CPU_NATIVE", "0")
    assert_same_bits(into, cpu.rows(x1, x2, y, 0.2, g, bfloat16=bf16))
    monkeypatch.setattr(cpu, "MAX_THREADS", 1)
    monkeypatch.setenv("CEK_CPU_NATIVE", "1")
    assert_same_bits(into, cpu.rows(x1, x2, y, 0.2, g, bfloat16=bf16))


def test_float16_gradients_round_as_numpys_cast(native, monkeypatch):
    # Gradients near float16's largest value and its subnormals: overflow to inf, ties to even.
    x1 = np.array([[60000.0, 1.0], [2.0**-20, 1.0], [1.0, 2.0**-24]], np.float16)
    x2 = np.array([[1.0, -60000.0], [1.0, 2.0**-20], [2.0**-24, 1.0]], np.float16)
    y = np.array([1.0, -1.0, 1.0])
    for g in (1e9, 3e4, 1e-7):
        assert_same_bits(*both(monkeypatch, x1, x2, y, -1.0, g))


def test_bfloat16_gradients_round_as_from_float(native, monkeypatch):
    # Gradients near bfloat16's largest value (3.39e38, rounding up to inf), in its subnormals
    # (below 1.2e-38), and NaN: the compiled rounding is cek.dtypes.from_float's. (Ties: the
    # 3 million gradients of test_many_threads_and_caller_buffers_give_the_same_bits hold 38.)
    big = 3.0e38
    x1 = stored([[big, 1.0, 0.5], [1e-30, 1.0, 3.0], [1.0, 1e-38, 2.0], [1.0, np.nan, 1.0]],
                "bf16")
    x2 = stored([[1.0, -big, 0.25], [1.0, 1e-30, -1.0], [1e-38, 1.0, 2.0], [1.0, 2.0, 3.0]],
                "bf16")
    y = np.array([1.0, -1.0, 1.0, 1.0])
    for g in (1e38, 3e4, 1e-30, 1.0 + 2.0**-8):
        compiled, numpy = both(monkeypatch, x1, x2, y, -1.0, g)
        assert_same_bits(compiled, numpy)
        # Against the float32 code on the widened rows, rounded once by from_float.
        monkeypatch.setenv("CEK_CPU_NATIVE", "0")
        wide = cpu.rows(dtypes.widen(x1, "bf16"), dtypes.widen(x2, "bf16"), y, -1.0, g)
        np.testing.assert_array_equal(compiled[0], wide[0])
        for got, want in zip(compiled[1:], wide[1:]):
            np.testing.assert_array_equal(got, dtypes.from_float(want, "bf16"))
        assert (compiled[1][3] & 0x7FFF > 0x7F80).all()  # the NaN row: NaN bits



@pytest.mark.parametrize("d", [8, 33, 1000])
def test_bfloat16_subnormal_gradients_round_as_from_float(native, monkeypatch, d):
    # Upstream gradients that put some of a row's gradients below float32's smallest normal
    # (1.2e-38) and leave others above it, 8 at a time: the compiled code rounds those 8 apart.
    rng = np.random.default_rng(d)
    x1, x2 = stored(rng.standard_normal((2, 6, d)), "bf16")
    y = np.array([1.0, -1.0, 1.0, -1.0, 1.0, -1.0])
    g = np.array([1e-34, 1e-35, 1e-36, 1e-37, 1e-38, 1e-39])
    compiled, numpy = both(monkeypatch, x1, x2, y, -1.0, g)
    assert_same_bits(compiled, numpy)
    small = (compiled[1] & 0x7F80) == 0
    assert small.any() and not small.all()


def test_without_a_compiler_the_numpy_code_runs(monkeypatch, tmp_path):
    monkeypatch.setenv("CEK_CPU_NATIVE", "1")
    monkeypatch.setenv("CEK_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "CXX", "no-such-compiler-cek")
    build.compiler_version.cache_clear()
    cpu_native._library.cache_clear()
    cpu_native._why_not.clear()
    try:
        assert cpu_native.rows_function("f32") is None
        assert "no-such-compiler-cek" in cpu_native.unavailable_reason()
        x1, x2 = np.random.default_rng(0).standard_normal((2, 4, 5))
        y = np.array([1.0, -1.0, 1.0, -1.0])
        loss, dx1, dx2 = F.cosine_embedding_loss_fused(x1, x2, y, 0.0, "sum")
        want = expected(x1, x2, y, 0.0, "sum", 1.0)
        for got, value, what in zip((loss, dx1, dx2), want, ("loss", "grad", "grad")):
            assert_close(got, value, np.float64, what)
    finally:
        build.compiler_version.cache_clear()
        cpu_native._library.cache_clear()
        cpu_native._why_not.clear()
    monkeypatch.setenv("CEK_CPU_NATIVE", "0")
    assert cpu_native.unavailable_reason() == "CEK_CPU_NATIVE=0"


def test_the_first_build_says_so_once_on_stderr(monkeypatch, tmp_path, capfd):
    """A first call that builds the rows waits seconds on g++: one line on stderr says what is
    built and where it is cached, stdout stays the program's; loading the cached library (a
    later process) says nothing."""
    monkeypatch.setenv("CEK_CPU_NATIVE", "1")
    monkeypatch.setenv("CEK_CACHE_DIR", str(tmp_path))
    cpu_native._library.cache_clear()
    cpu_native._why_not.clear()
    try:
        capfd.readouterr()
        assert cpu_native.rows_function("f32") is not None, cpu_native.unavailable_reason()
        assert cpu_native.rows_function("f64") is not None  # the same library: no second line
        out, err = capfd.readouterr()
        assert out == ""
        assert err == (f"cek: building cek/cpu_native.cpp with {build.CXX} for this CPU, once "
                       f"(cached in {tmp_path / 'cpu'})\n")
        cpu_native._library.cache_clear()  # as a new process would: the library is cached now
        assert cpu_native.rows_function("f32") is not None
        assert capfd.readouterr() == ("", "")
    finally:
        cpu_native._library.cache_clear()
        cpu_native._why_not.clear()
