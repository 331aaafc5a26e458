"""The CPU emulator: right numbers on the real kernels, and every planted bug caught.

The planted kernels in tests/planted/ each carry one bug that a GPU would not report; each test
checks that the emulator names it (with the .cu file and line where it has one).
"""

import concurrent.futures
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import cek
from cek import dtypes
from cek.compile import CompileError
from cek.kernel import Arg, Kernel

emulate = pytest.importorskip("cek.emulate")
from cek.emulate import KernelError, build, sanitize as sanitized  # noqa: E402
from oracle import expected_rows  # noqa: E402

pytestmark = pytest.mark.emulator

PLANTED = Path(__file__).resolve().parent / "planted"
ROOT = PLANTED.parent.parent
MATRIX = ("n_rows", "n_dim")


class Planted(Kernel):
    """A kernel from tests/planted/<stem>.cu: planted_<stem>(x, out, n_rows, n_dim)."""

    args = (Arg("x", "float*", MATRIX), Arg("out", "float*", MATRIX, output=True),
            Arg("n_rows", "int"), Arg("n_dim", "int"))

    def __init__(self, stem: str):
        self.name = f"planted_{stem}"
        self.path = PLANTED / f"{stem}.cu"
        super().__init__(128)

    @property
    def kernel_source(self) -> str:
        return f'#line 1 "{self.path}"\n{self.path.read_text()}'


def run_planted(stem, n_rows=2, n_dim=64, threads=64, shared_mem=0, kernel=None, **options):
    x = np.arange(n_rows * n_dim, dtype=np.float32).reshape(n_rows, n_dim)
    out = np.full_like(x, np.nan)
    launch = emulate.load(kernel or Planted(stem), **options)
    launch((n_rows,), (threads,), (x, out, n_rows, n_dim), shared_mem=shared_mem)
    return x, out


def needs_sanitizer(flavour):
    try:
        sanitized._preload(flavour)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"sanitize={flavour!r} unavailable: {exc}")


def assert_located(error, stem, lines):
    assert error.file is not None and error.file.endswith(f"planted/{stem}.cu"), str(error)
    assert error.line in lines, str(error)


# -- the real kernels, against float64 ----------------------------------------------------

def make_inputs(n_rows, n_dim, seed=0):
    rng = np.random.default_rng(seed)
    x1 = rng.standard_normal((n_rows, n_dim), dtype=np.float32)
    x2 = rng.standard_normal((n_rows, n_dim), dtype=np.float32)
    y = rng.choice(np.array([1, -1, 0], np.float32), n_rows)
    dy = rng.standard_normal(n_rows, dtype=np.float32)
    return x1, x2, y, dy


expected = expected_rows  # (loss, dx1, dx2) per row, float64


def assert_close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def run_backward(n_rows, n_dim, margin=0.1, **options):
    kernel = cek.CosineEmbeddingLossBackward.for_n_dim(n_dim)
    x1, x2, y, dy = make_inputs(n_rows, n_dim)
    dx1, dx2 = np.full_like(x1, np.nan), np.full_like(x1, np.nan)
    grid, block, smem = kernel.launch_config(n_rows, n_dim)
    args = (dy, x1, x2, y, dx1, dx2, n_rows, n_dim, margin)  # the documented nine
    emulate.load(kernel, **options)(grid, block, args, shared_mem=smem)
    return (x1, x2, y, dy), dx1, dx2


@pytest.mark.parametrize("n_rows,n_dim", [(7, 33), (3, 768), (2, 4096)])
def test_forward_matches_float64(n_rows, n_dim):
    kernel = cek.CosineEmbeddingLossForward.for_n_dim(n_dim)
    x1, x2, y, dy = make_inputs(n_rows, n_dim)
    out = np.full(n_rows, np.nan, np.float32)
    grid, block, smem = kernel.launch_config(n_rows, n_dim)
    emulate.load(kernel)(grid, block, (x1, x2, y, out, n_rows, n_dim, 0.1), shared_mem=smem)
    assert_close(out, expected(x1, x2, y, dy, 0.1)[0])


@pytest.mark.parametrize("n_rows,n_dim", [(7, 33), (3, 768), (2, 4096)])
def test_backward_matches_float64(n_rows, n_dim):
    inputs, dx1, dx2 = run_backward(n_rows, n_dim)
    _, want1, want2 = expected(*inputs, 0.1)
    assert_close(dx1, want1)
    assert_close(dx2, want2)


def test_schedules_give_bitwise_identical_results():
    _, base1, base2 = run_backward(7, 1000)
    for schedule in ("reverse", "random:1", "random:2"):
        _, dx1, dx2 = run_backward(7, 1000, schedule=schedule)
        assert np.array_equal(dx1, base1) and np.array_equal(dx2, base2), schedule


@pytest.mark.parametrize("flavour", ["thread", "address"])
def test_sanitizers_find_nothing_in_the_backward_kernel(flavour):
    needs_sanitizer(flavour)
    inputs, dx1, dx2 = run_backward(3, 129, sanitize=flavour)
    _, want1, want2 = expected(*inputs, 0.1)
    assert_close(dx1, want1)  # the outputs come back from the sanitized subprocess
    assert_close(dx2, want2)


# -- the build cache -----------------------------------------------------------------------

def test_cache_dir_is_honoured_and_a_second_load_does_not_compile(tmp_path, monkeypatch):
    monkeypatch.setenv("CEK_CACHE_DIR", str(tmp_path))
    kernel = cek.CosineEmbeddingLossForward(32)
    first = emulate.load(kernel).library
    assert Path(first).parent == tmp_path / "emulate"
    build.forget()  # as a new process would: only the disk cache is left
    before = build.compiles
    assert emulate.load(kernel).library == first
    assert build.compiles == before


def test_threads_loading_at_once_build_once(tmp_path, monkeypatch):
    monkeypatch.setenv("CEK_CACHE_DIR", str(tmp_path))
    kernel = cek.CosineEmbeddingLossForward(64)
    before = build.compiles
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        paths = set(pool.map(lambda _: emulate.load(kernel).library, range(4)))
    assert len(paths) == 1
    assert build.compiles - before == 2  # the runtime object, then the kernel library


def test_bad_options_are_rejected():
    kernel = cek.CosineEmbeddingLossForward(32)
    with pytest.raises(ValueError, match="schedule"):
        emulate.load(kernel, schedule="backwards")
    with pytest.raises(ValueError, match="sanitize"):
        emulate.load(kernel, sanitize="memory")


# -- planted bugs ---------------------------------------------------------------------------

def test_missing_syncthreads_is_a_race_and_gives_wrong_numbers():
    x, _ = run_planted("missing_syncthreads", threads=128)
    right = x.sum(axis=1)
    wrong = []
    for schedule in ("forward", "reverse", "random:1"):
        _, out = run_planted("missing_syncthreads", threads=128, schedule=schedule)
        wrong.append(not np.allclose(out[:, 0], right))
    assert any(wrong)
    needs_sanitizer("thread")
    with pytest.raises(KernelError, match="data race") as caught:
        run_planted("missing_syncthreads", threads=128, sanitize="thread")
    assert_located(caught.value, "missing_syncthreads", {11, 14})


def test_off_by_one_store_is_out_of_bounds():
    needs_sanitizer("address")
    with pytest.raises(KernelError, match="heap-buffer-overflow") as caught:
        run_planted("off_by_one_store", sanitize="address")
    assert_located(caught.value, "off_by_one_store", {7})


def test_divergent_syncthreads():
    with pytest.raises(KernelError, match="divergent __syncthreads") as caught:
        run_planted("divergent_syncthreads")
    assert_located(caught.value, "divergent_syncthreads", {8, 10})


# A helper called from both arms of a divergent branch: one source line, two sites on a GPU
# (each inlined copy is its own instruction). The error names the helper's line and both callers.
@pytest.mark.parametrize("stem, what, helper, callers", [
    ("divergent_helper_shuffle", "divergent shuffle", 5, (14, 16)),
    ("divergent_helper_barrier", "divergent __syncthreads", 3, (12, 14)),
])
def test_a_helper_called_from_both_arms_of_a_branch_is_two_sites(stem, what, helper, callers):
    with pytest.raises(KernelError, match=what) as caught:
        run_planted(stem)
    assert_located(caught.value, stem, {helper})
    message = str(caught.value)
    assert "\n" not in message
    source = f"{PLANTED / stem}.cu"
    # forward schedule: thread 1 (odd) comes second, from the first caller; thread 0 waits
    assert "thread (1,0,0) of block (0,0,0)" in message, message
    assert f" here (called from {source}:{callers[0]}) " in message, message
    assert f" at {source}:{helper} (called from {source}:{callers[1]})" in message, message


class RelativelyNamed(Planted):
    """A planted kernel under a `kernels/...` name, as cek.sources names the kernels' files."""

    @property
    def kernel_source(self) -> str:
        return f'#line 1 "kernels/{self.path.name}"\n{self.path.read_text()}'


def test_callers_in_a_relatively_named_file_are_named_as_the_file_is():
    # g++ writes a relative name into the line tables joined to the folder it was built in,
    # a scratch folder that is gone: the callers are named as the site is.
    with pytest.raises(KernelError) as caught:
        run_planted("divergent_helper_shuffle", kernel=RelativelyNamed("divergent_helper_shuffle"))
    assert str(caught.value).startswith("kernels/divergent_helper_shuffle.cu:5: divergent shuffle")
    assert " here (called from kernels/divergent_helper_shuffle.cu:14) " in str(caught.value)


@pytest.mark.parametrize("schedule", ["forward", "reverse", "random:3"])
def test_the_same_helpers_called_once_by_every_thread_pass(schedule):
    x, out = run_planted("converged_helpers", schedule=schedule)
    v = np.where(np.arange(64) % 2, x * 3, x)
    assert np.array_equal(out, v + v.reshape(2, 32, 2)[:, :, ::-1].reshape(2, 64))


class Bounded(Planted):
    """A planted kernel whose entry point promises __launch_bounds__(64)."""

    max_threads = 64


def test_a_block_over_the_entry_points_launch_bounds_is_refused():
    x = np.zeros((2, 128), np.float32)
    launch = emulate.load(Bounded("converged_helpers"))
    with pytest.raises(ValueError) as caught:
        launch((2,), (128,), (x, x.copy(), 2, 128))
    assert str(caught.value) == (
        "block (128, 1, 1) has 128 threads, more than the 64 of "
        "planted_converged_helpers_entry_point's __launch_bounds__: a GPU refuses it")
    launch((2,), (64,), (x, x.copy(), 2, 128))  # within the bound: runs


def test_deadlock_is_reported_at_once():
    emulate.load(Planted("deadlock"))  # build outside the clock
    start = time.perf_counter()
    with pytest.raises(KernelError, match="deadlock") as caught:
        run_planted("deadlock")
    assert time.perf_counter() - start < 1.0
    assert_located(caught.value, "deadlock", {9})


def test_shuffle_reading_an_exited_lane():
    with pytest.raises(KernelError, match="has exited") as caught:
        run_planted("shuffle_exited_lane")
    assert_located(caught.value, "shuffle_exited_lane", {7})


def test_barrier_after_some_threads_exited():
    with pytest.raises(KernelError, match="already exited") as caught:
        run_planted("exit_before_barrier", n_dim=40)
    assert_located(caught.value, "exit_before_barrier", {9})


@pytest.mark.parametrize("stem", ["misaligned_float4", "misaligned_ldg"])
def test_misaligned_float4_load(stem):
    with pytest.raises(KernelError, match="misaligned") as caught:
        run_planted(stem)
    assert_located(caught.value, stem, {6})


def test_construct_outside_the_subset_fails_to_compile():
    with pytest.raises(CompileError, match="atomicCAS") as caught:
        emulate.load(Planted("outside_subset"))
    assert "outside_subset.cu:7" in str(caught.value)


def test_dynamic_shared_memory():
    x, out = run_planted("dynamic_shared", n_dim=100, shared_mem=400)
    assert np.array_equal(out, x[:, ::-1])


def test_dynamic_shared_memory_past_shared_mem_is_out_of_bounds():
    needs_sanitizer("address")
    with pytest.raises(KernelError, match="use-after-poison") as caught:
        run_planted("dynamic_shared", n_dim=100, shared_mem=200, sanitize="address")
    assert_located(caught.value, "dynamic_shared", {7})


# -- the 16-bit conversions' C++ fallback, bit for bit against NumPy -------------------------

class ConvertProbe(Kernel):
    """Rounds float pairs with CekType<T>::from_acc2 and widens T bits with to_acc."""

    name = "cek_convert_probe"
    kind = "probe"
    args = (Arg("f", "float*", ("n",)), Arg("packed", "float*", ("n_half",), output=True),
            Arg("bits", "T*", ("n",)), Arg("widened", "float*", ("n",), output=True),
            Arg("n", "int"), Arg("n_half", "int"))

    @property
    def kernel_source(self) -> str:
        from cek.sources import load_kernel_source

        return load_kernel_source("cek_types.cuh") + """
template <int BLOCK_SIZE, typename T>
__device__ void cek_convert_probe(const float* f, float* packed, const T* bits, float* widened,
                                  int n, int n_half) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_half) packed[i] = cek_float_from_bits(CekType<T>::from_acc2(f[2 * i], f[2 * i + 1]));
    if (i < n) widened[i] = CekType<T>::to_acc(bits[i]);
}
"""


def _float_sweep():
    """Every float16 value, the midpoints between neighbours (ties, both parities) and their
    next floats, bfloat16's alike over its normal range, random bit patterns and specials."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    halves = halves[np.isfinite(halves)]
    halves.sort()
    mids = ((halves[:-1].astype(np.float64) + halves[1:]) / 2).astype(np.float32)
    b16 = (np.arange(1 << 16, dtype=np.uint32) << 16).view(np.float32)
    b16 = b16[np.isfinite(b16)]
    b16_mids = (b16.view(np.uint32) | 0x8000).view(np.float32)  # exactly halfway below the next
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.996, 65520, 3.4e38,
                         1e-45, -1e-40, 2.0**-25, 2.0**-24 * 1.5], np.float32)
    out = np.concatenate([halves, mids, np.nextafter(mids, np.float32(np.inf)), b16, b16_mids,
                          np.nextafter(b16_mids, np.float32(0)), random, specials])
    return out if out.size % 2 == 0 else np.append(out, np.float32(1))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_16_bit_conversions_round_as_numpy_does(dtype):
    f = _float_sweep()
    bits = np.arange(1 << 16, dtype=np.uint16)
    bits = np.resize(bits, f.size)  # every pattern at least once
    typed = bits.view(np.float16) if dtype == "f16" else bits
    packed = np.full(f.size // 2, np.nan, np.float32)
    widened = np.full(f.size, np.nan, np.float32)
    kernel = ConvertProbe(256, dtype)
    emulate.load(kernel)((-(-f.size // 256),), (256,),
                         (f, packed, typed, widened, f.size, f.size // 2))
    got = packed.view(np.uint32)
    got = np.stack([got & 0xFFFF, got >> 16], axis=1).reshape(-1).astype(np.uint16)
    with np.errstate(over="ignore"):  # past float16: inf, as the kernels round
        want16 = f.astype(np.float16).view(np.uint16)
    want = (want16 if dtype == "f16"
            else dtypes.from_float(f, "bf16"))
    nan = np.isnan(f)
    assert np.array_equal(got[~nan], want[~nan]), np.argwhere(got[~nan] != want[~nan])[:3]
    assert np.isnan(dtypes.to_float64(got[nan].view(np.float16) if dtype == "f16"
                                      else got[nan], dtype)).all()
    want_wide = dtypes.widen(typed, dtype).astype(np.float32)
    same = (widened.view(np.uint32) == want_wide.view(np.uint32)) | (
        np.isnan(widened) & np.isnan(want_wide))
    assert same.all(), np.argwhere(~same)[:3]


# -- reading the line tables: the paths of g++'s copies of one source line ---------------------

def _check_backward_rows_at_one(env):
    """`cek check` of the backward-rows kernel at D = 1, where g++ copies the code between two
    tests of one condition into both branches, so converged lanes reach two copies of one
    shuffle: one site of the source, which only the line tables tell."""
    return subprocess.run(
        [sys.executable, "-m", "cek", "check", "--device", "cpu", "--kernel", "backward-rows",
         "--n-dim", "1", "--dtype", "f32"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, capture_output=True,
        text=True, timeout=600)


def test_copies_of_one_shuffle_pass_without_addr2line(tmp_path):
    """Where addr2line cannot be run (a toolchain whose binutils have prefixed names), the copies
    are not known to differ: the kernel passes, as it does on a GPU, rather than being reported
    as a divergent shuffle."""
    fake = tmp_path / "addr2line"
    fake.write_text("#!/bin/sh\nexit 127\n")
    fake.chmod(0o755)
    done = _check_backward_rows_at_one({"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "divergent" not in done.stdout + done.stderr


def test_copies_of_one_shuffle_pass_from_a_cache_path_with_a_quote(tmp_path):
    """The line tables are read without a shell between: a quote in the cache's path (a home
    folder such as /home/o'brien) is a path like any other."""
    cache = tmp_path / "o'brien"
    done = _check_backward_rows_at_one({"CEK_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "divergent" not in done.stdout + done.stderr
