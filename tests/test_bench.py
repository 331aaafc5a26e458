"""`cek bench`: its arithmetic and its CuPy baseline on the CPU; the whole bench on the stand-in
for CuPy (tests/fake_cupy.py) with the emulator as the GPU; a small real run in the gpu tier."""

import dataclasses
import datetime
import json
import sys
import types

import fake_cupy
from conftest import bench_calls
import numpy as np
import pytest
from click.testing import CliRunner

from cek import bench, bench_providers, check, dtypes, reference
from cek.cli import main
from cek.kernel import kernel_classes


def test_percentiles_and_bandwidth_arithmetic():
    median, p20, p80 = bench.percentiles([float(i) for i in range(1, 101)])
    assert (median, p20, p80) == (50.5, pytest.approx(20.8), pytest.approx(80.2))
    assert bench.gb_per_s(2_000_000_000, 1000.0) == 2.0


def test_checked_rows_shrink_for_wide_rows():
    assert bench.check_rows(65536, 768) == 2048
    assert bench.check_rows(3052, 16384) == 128  # 2^21 elements
    assert bench.check_rows(4, 1 << 20) == 4  # one row of each label
    assert bench.check_rows(7, 8) == 7


@pytest.mark.parametrize("margin, scale", [(0.0, 1.0), (0.5, 1 / 7), (-0.5, 1.0)])
def test_cupy_baseline_math_matches_the_reference_on_numpy(margin, scale):
    inputs = check.make_inputs(7, 33, seed=3)
    loss, dx1, dx2 = bench.cupy_math(np, inputs["x1"], inputs["x2"], inputs["y"], margin, scale)
    want = reference.forward(inputs["x1"], inputs["x2"], inputs["y"], margin)
    np.testing.assert_allclose(loss, want, rtol=1e-4, atol=1e-5)
    args = (np.full(7, scale), inputs["x1"], inputs["x2"], inputs["y"], margin)
    w1, w2 = reference.backward(*args)
    m1, m2 = reference.gradient_magnitudes(*args)
    _, _, failures = check.compare({"dx1": dx1, "dx2": dx2}, {"dx1": w1, "dx2": w2},
                                   {"dx1": m1, "dx2": m2})
    assert not failures


def _error_line(result) -> str:
    """The one error line of a CliRunner result, `Error: ...` on stderr, with nothing on
    stdout (a usage error has click's usage lines above it)."""
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and result.stderr.endswith(errors[0] + "\n"), result.stderr
    return errors[0]


def test_bench_without_a_gpu_exits_1_with_one_line(monkeypatch):
    # Exit 1: "no device for a GPU-only command", as `cek --help` states.
    from cek import gpu

    monkeypatch.setattr(gpu, "device_count", lambda: 0)
    monkeypatch.setattr(gpu, "no_device_reason", lambda: "no NVIDIA driver is installed")
    result = CliRunner().invoke(main, ["bench", "--n-dim", "768"])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: no CUDA device (no NVIDIA driver is installed), and bench times GPU kernels "
        "only; `cek check --device cpu` and `cek compile` work without one\n")
    assert "no device for a GPU-only command" in " ".join(
        CliRunner().invoke(main, ["--help"]).output.split())


@pytest.mark.parametrize("args, message", [
    (["--baseline", "numba"], "Invalid value for '--baseline': unknown baseline 'numba'; choose "
                              "from cupy, torch, torch-compile, cek-torch, cek-torch-graph, "
                              "cek-torch-compile (or 'none')"),
    (["--n-rows", "-3"], "Invalid value for '--n-rows': must be a positive integer below 2**31 "
                         "or 'auto', got '-3'"),
    (["--n-rows", str(2**31)], "Invalid value for '--n-rows': must be a positive integer below "
                               f"2**31 or 'auto', got '{2**31}'"),
    (["--margin", "nan"], "Invalid value for '--margin': margin must be finite, got nan"),
    (["--margin", "-inf"], "Invalid value for '--margin': margin must be finite, got -inf"),
    (["--plot", "."], "Invalid value for '--plot': File '.' is a directory."),
    (["--json-file", "."], "Invalid value for '--json-file': File '.' is a directory."),
])
def test_bench_bad_values_exit_2_before_any_work(monkeypatch, args, message):
    # The device is asked after the options: a bad value must not wait for (or need) a GPU.
    from cek import gpu

    monkeypatch.setattr(gpu, "device_count", lambda: pytest.fail("asked for a device"))
    result = CliRunner().invoke(main, ["bench", "--n-dim", "768", *args])
    assert result.exit_code == 2
    assert _error_line(result) == f"Error: {message}"


def test_bench_unwritable_output_exits_1_before_any_work(monkeypatch):
    # A file that cannot be written is exit 1, as `cek compile --out` under /proc is.
    from cek import gpu

    monkeypatch.setattr(gpu, "device_count", lambda: pytest.fail("asked for a device"))
    for option in ("--json-file", "--plot"):
        result = CliRunner().invoke(main, ["bench", "--n-dim", "768", option, "no/such/b.json"])
        assert result.exit_code == 1
        assert result.stderr == f"Error: cannot write to {option} no/such/b.json: No such file " \
                                "or directory\n"


def test_bench_plot_without_matplotlib_is_refused_before_any_work(monkeypatch, tmp_path):
    # A missing piece is exit 1, as a missing NVRTC is for `cek compile`.
    import importlib.util

    from cek import gpu

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(gpu, "device_count", lambda: pytest.fail("asked for a device"))
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    result = CliRunner().invoke(main, ["bench", "--n-dim", "8", "--plot", str(tmp_path / "b.png")])
    assert result.exit_code == 1
    assert result.stderr == "Error: --plot needs matplotlib: pip install matplotlib\n"


def test_bench_refuses_a_read_only_folder(monkeypatch, tmp_path):
    from cek import gpu

    def unwritable(*args, **kwargs):  # as a read-only folder answers, even for root
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gpu, "device_count", lambda: pytest.fail("asked for a device"))
    monkeypatch.setattr("tempfile.TemporaryFile", unwritable)
    result = CliRunner().invoke(main, ["bench", "--n-dim", "8", "--json-file",
                                       str(tmp_path / "b.json")])
    assert result.exit_code == 1
    assert result.stderr == f"Error: cannot write to --json-file {tmp_path / 'b.json'}: " \
                            "Permission denied\n"


@pytest.mark.parametrize("args, message", [
    (["--repeat", "10"], "10 is not in the range x>=50"),
    (["--dtype", "bf8"], "Invalid value for '--dtype'"),
])
def test_bench_usage_errors(args, message):
    result = CliRunner().invoke(main, ["bench", "--n-dim", "768", *args])
    assert result.exit_code == 2 and message in result.output


def test_auto_rows_is_the_library_rule():
    assert bench.auto_rows(768) == 65104 and bench.auto_rows(128) == 390625
    assert bench.auto_rows(1 << 20) == 48 and bench.auto_rows(10**9) == 1


@pytest.mark.parametrize("name, capability, want", [
    ("NVIDIA H200", "90", ("sm_90", "h200")),
    ("NVIDIA A100-SXM4-80GB", "80", ("sm_80", "a100")),
    ("NVIDIA H100 80GB HBM3", "90", ("sm_90", "h100")),
    ("NVIDIA H100 PCIe", "90", ("sm_90", None)),  # 114 SMs, not the SXM's 132
    ("NVIDIA GeForce RTX 4090", "89", ("sm_89", None)),
    ("Something", None, ("sm_90", None)),
])
def test_static_target_from_the_device(name, capability, want):
    device = type("Device", (), {} if capability is None else {"compute_capability": capability})
    cupy = type("cupy", (), {"cuda": type("cuda", (), {"Device": device})})
    assert bench.static_target(cupy, name) == want


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from cek.plot import plot_bandwidth

    rows = [{"kernel": "fused", "provider": p, "n_dim": d, "gb_per_s": g, "gpu": "test"}
            for p, g in (("cek", 3000.0), ("torch", 900.0)) for d in (128, 768)]
    plot_bandwidth(rows, tmp_path / "bw.png")
    assert (tmp_path / "bw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
def test_bench_runs_checks_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--n-dim", "768", "--n-rows", "4096",
                                       "--kernel", "all", "--dtype", "f32", "--dtype", "bf16",
                                       "--baseline", "cupy,torch", "--repeat", "50",
                                       "--json-file", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert {r["provider"] for r in rows} >= {"cek", "cupy"}
    assert {r["dtype"] for r in rows} == {"f32", "bf16"}
    assert all(r["gb_per_s"] > 0 and 0 < r["pct_of_copy"] for r in rows)
    assert {"kernel", "provider", "dtype", "n_rows", "n_dim", "reduction", "median_ms", "p20_ms",
            "p80_ms", "gb_per_s", "pct_of_copy", "gpu", "versions", "timestamp"} <= set(rows[0])
    assert rows[0]["gpu"] and {"cupy", "cuda_driver", "nvrtc", "nvrtc_cek", "cek"} <= set(
        rows[0]["versions"])


# -- the whole bench on the stand-in -------------------------------------------------------------

# The one-block-per-row kernels; a split pair is timed in a test of its own
# (test_a_split_pair_is_timed_as_one_run): its 1024-thread blocks are slow to emulate 57 times.
KERNELS = [k for k, cls in kernel_classes().items() if cls.first is None and cls.kind != "sums"]
SHAPES = [(64, 8), (8, 768)]  # row groups; registers. Both have more rows than are checked.
PROVIDERS = ["cek", "cupy", "torch"]  # torch-compile would compile C++ for minutes


def timed_rows(kernels=KERNELS, providers=PROVIDERS) -> list[tuple[str, str, str]]:
    """(kernel, provider, reduction) of every row a run times, in order: the fused kernel's cek
    rows alone and as a mean, PyTorch's a training step (a mean), the rest per row."""
    return [(k, p, r) for k in kernels for p in providers
            for r in bench.reductions(kernel_classes()[k].for_n_dim(8), p, 64, 8)]
FAKE = fake_cupy.FAKE_MS * 10  # what one timing of 50 repetitions reads
# What the stand-in static report says of every kernel (the real one compiles each kernel):
# shown in the bench table as rounds 2, occ% 75, inflight/SM 48K (49152 / 1024), need/SM 8K.
STATIC = {"occupancy": 0.75, "sass": {"load_rounds": 2}, "bytes_in_flight_per_sm": 49152,
          "needed_bytes_in_flight_per_sm": 8289}


@pytest.fixture
def standin(monkeypatch):
    """The stand-in for CuPy, with the flush buffer down to one float (its size is a GPU's L2
    matter) and fewer checked rows than the shapes have, so the host rows are a prefix."""
    pytest.importorskip("torch", reason="the torch baseline runs on CPU tensors")
    s = fake_cupy.install(monkeypatch)
    monkeypatch.setattr(bench, "FLUSH_BYTES", 4)
    monkeypatch.setattr(bench, "CHECK_ROWS", 6)
    _static_report(monkeypatch, lambda kernel, n_rows, n_dim, *, arch, gpu: {
        "kernel_id": kernel.id, **STATIC})
    return s


def _static_report(monkeypatch, static_row):
    """A stand-in cek.report with this static_row (the real one compiles every kernel), or
    none at all for None."""
    module = None
    if static_row is not None:
        module = types.ModuleType("cek.report")
        module.static_row = static_row
    monkeypatch.setitem(sys.modules, "cek.report", module)
    monkeypatch.setattr(bench, "_said", set())


def _short(failure: str) -> tuple[str, str]:
    """(kernel, provider) of a failure line "<kernel id> <provider> <N>x<D>: why"."""
    kernel_id, provider = failure.split()[:2]
    short = {cls.name: short for short, cls in kernel_classes().items()}
    return short[kernel_id.split("__")[0]], provider


def _bytes(kernel: str, dtype: str, n: int, d: int, reduction: str = "none") -> int:
    """The row kernel's bytes, and a mean's: the per-row losses read again, the result written
    (A*N + S); a keep kernel's kept case its one dy, its recompute case the backward's with
    that one dy in place of one a row."""
    k = kernel_classes()[kernel].for_n_dim(d, dtype)
    itemsize = dtypes.get(dtype).array.itemsize
    if reduction == "kept":
        return itemsize
    n_bytes = k.bytes_moved(n, d) - (itemsize * (n - 1) if reduction == "recompute" else 0)
    if k.first is not None:  # a split pair: its partial sums first
        n_bytes += k.first.for_n_dim(d, dtype).bytes_moved(n, d)
    if reduction == "mean":
        d_type = dtypes.get(dtype)
        n_bytes += d_type.acc.itemsize * n + d_type.array.itemsize
    return n_bytes


def _refused(dtype: str, d: int) -> set:
    """Providers right to fail: PyTorch in float16 at D = 768, where sq1*sq2 (~768^2) overflows
    float16 to inf, the cosine comes out 0 and the loss 1 (README: eager PyTorch gives 1 there)."""
    refused = {(k, "torch") for k in KERNELS if not getattr(kernel_classes()[k], "wave_grid", False)}
    return refused if (dtype, d) == ("f16", 768) else set()


def test_what_each_provider_times():
    fused, forward = kernel_classes()["fused"].for_n_dim(8), kernel_classes()["forward"](8)
    assert bench.reductions(fused, "cek", 64, 8) == ("none", "mean")
    assert bench.reductions(fused, "cupy", 64, 8) == ("none",)
    assert all(bench.reductions(fused, p, 64, 8) == ("mean",) for p in bench.PROVIDERS[2:])
    assert bench.reductions(forward, "torch", 64, 8) == ("none",)
    keep = kernel_classes()["backward-keep"].for_n_dim(8)
    assert bench.reductions(keep, "cek", 64, 8) == ("kept", "recompute")
    assert all(bench.reductions(keep, p, 64, 8) == () for p in bench.PROVIDERS[1:])
    assert all(bench.reductions(forward, p, 64, 8) == () for p in bench.CEK_TORCH_PROVIDERS)
    assert bench.bytes_moved(fused, "mean", 64, 768) == fused.bytes_moved(64, 768) + 4 * 64 + 4
    # The baselines beside the kernel cek's launchers run at the shape: the split's pair for 8
    # rows of 2^20, one block a row for 512 rows of 32768; cek itself whichever is asked for.
    split_fused = kernel_classes()["fused-split"].for_n_dim(1 << 20)
    sums = kernel_classes()["split-sums"].for_n_dim(1 << 20)
    for n, d, picked in ((8, 1 << 20, split_fused), (512, 32768, fused)):
        for kernel in (fused, split_fused):
            assert bench.reductions(kernel, "cek", n, d) == ("none", "mean")
            want = ("mean",) if kernel is picked else ()
            assert bench.reductions(kernel, "torch", n, d) == want
            assert bench.reductions(kernel, "cek-torch", n, d) == want
    assert bench.reductions(sums, "cek", 8, 1 << 20) == ("none",)
    assert bench.reductions(sums, "cupy", 8, 1 << 20) == ()
    # a pair's bytes: the partial sums' launch and the second one's (x1, x2 twice, dx1, dx2,
    # the partials written and read, y read, the loss and the labels' copy written)
    assert bench.bytes_moved(split_fused, "none", 8, 1 << 20) == \
        sums.bytes_moved(8, 1 << 20) + split_fused.bytes_moved(8, 1 << 20) == \
        16 * 8 * (6 << 20) // 4 + 8 * 4 * 8 * 256 + 3 * 4 * 8


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", list(dtypes.DTYPES))
def test_run_bench_end_to_end_on_the_stand_in(standin, dtype):
    """run_bench as on a GPU, with NumPy as CuPy and the emulator as the kernels; PyTorch on CPU
    tensors shared through DLPack. The timing numbers are meaningless here: each pair of fake
    CUDA events reports the next of FAKE_MS, so every timing of 50 repetitions has the same
    median, p20 and p80, and what is checked is the arithmetic on them (GB/s from the kernel's
    bytes formula, % of the copy, the speed-up), not a speed. What is real: the inputs of the
    dtype, every provider's first run judged against the float64 reference of the host inputs
    (so the device inputs begin with them), the kernel of the dtype launched through cek.gpu's
    checks, and each provider timed only when right."""
    median, p20, p80 = np.median(FAKE), np.percentile(FAKE, 20), np.percentile(FAKE, 80)
    for n, d in SHAPES:
        standin.launches.clear()
        reads = standin.elapsed_reads
        rows, failures = bench.run_bench(KERNELS, n, d, PROVIDERS, 50, log=lambda m: None,
                                         dtype=dtype)
        assert {_short(f) for f in failures} == _refused(dtype, d), failures
        assert all("wrong result" in f and f.endswith("not timed") for f in failures)
        timed = [t for t in timed_rows() if t[:2] not in _refused(dtype, d)]
        assert [(r.kernel, r.provider, r.reduction) for r in rows] == timed
        # One timing for the copy and one per right provider, 50 repetitions each.
        assert standin.elapsed_reads - reads == 50 * (1 + len(timed))
        # cek: the kernel of the dtype, once through gpu.load, once checked, 5 + 50 timed,
        # after the first of its pair (the split's partial sums); the fused kernels twice
        # (alone and as a mean), the mean's reduction after each; the keep kernels twice
        # (an upstream gradient of 1 kept, one of 3 recomputed).
        runs = {kernel: 2 if kernel.startswith("fused") or kernel.startswith("backward-keep")
                else 1 for kernel in KERNELS}
        pairs = sum(r for k, r in runs.items() if kernel_classes()[k].first is not None)
        for kernel in KERNELS:
            count = runs[kernel] + (pairs if kernel == "split-sums" else 0)
            assert standin.ids().count(kernel_classes()[kernel].for_n_dim(d, dtype).id) == \
                57 * count
        means = sum(k.startswith("fused") for k in KERNELS)
        assert standin.ids().count(f"cosine_embedding_loss_reduce__{dtype}__1024") == 57 * means
        assert len(standin.launches) == 57 * (sum(runs.values()) + pairs + means)

        copy_bytes = 2 * 2 * n * d * dtypes.get(dtype).array.itemsize  # x1 and x2, read + write
        for r in rows:
            assert (r.dtype, r.n_rows, r.n_dim) == (dtype, n, d)
            assert (r.median_ms, r.p20_ms, r.p80_ms) == pytest.approx((median, p20, p80))
            n_bytes = _bytes(r.kernel, dtype, n, d, r.reduction)
            assert r.gb_per_s == pytest.approx(n_bytes / (median * 1e-3) / 1e9, rel=1e-12)
            assert r.pct_of_copy == pytest.approx(100 * n_bytes / copy_bytes, rel=1e-12)
            assert r.speedup_of_cek == (None if r.provider == "cek" else pytest.approx(1.0))
            assert r.versions["nvrtc"] == "{}.{}".format(*fake_cupy.NVRTC_VERSION)
            assert r.gpu == fake_cupy.NAME
            assert r.versions["cuda_runtime"] == r.versions["cuda_driver"] == fake_cupy.CUDA_VERSION
            assert {"cek", "python", "numpy", "cupy", "torch"} <= set(r.versions)
            datetime.datetime.fromisoformat(r.timestamp)


@pytest.mark.emulator
def test_a_split_pair_is_timed_as_one_run(standin):
    """One row of 32768 floats, which cek's launchers split (one of 16385 runs one block a row
    since cek/split_model.py counts the split's instruction issue): fused-split is timed alone
    and as a mean, each run its partial sums then its own launch (and the reduction), with the
    bytes of both; the baselines run beside it, the kernel users get there, and not beside
    fused, which is timed for cek alone."""
    n, d = 1, 32768
    rows, failures = bench.run_bench(["fused", "fused-split"], n, d, PROVIDERS, 50,
                                     log=lambda m: None)
    assert failures == []
    assert [(r.kernel, r.provider, r.reduction) for r in rows] == [
        ("fused", "cek", "none"), ("fused", "cek", "mean"), ("fused-split", "cek", "none"),
        ("fused-split", "cek", "mean"), ("fused-split", "cupy", "none"),
        ("fused-split", "torch", "mean")]
    ids = standin.ids()
    sums, pair = (kernel_classes()[k].for_n_dim(d).id for k in ("split-sums", "fused-split"))
    assert ids.count(sums) == ids.count(pair) == 2 * 57
    assert all(ids[i - 1] == sums for i, k in enumerate(ids) if k == pair)
    for r in rows:
        n_bytes = _bytes(r.kernel, "f32", n, d, r.reduction)
        assert r.gb_per_s == pytest.approx(n_bytes / (np.median(FAKE) * 1e-3) / 1e9, rel=1e-12)
        assert r.speedup_of_cek == (None if r.provider == "cek" else pytest.approx(1.0))


@pytest.mark.emulator
def test_bench_command_writes_json_and_a_table(standin, tmp_path):
    """The CLI over two dtypes and every one-block kernel; timings are the stand-in's fake
    ones."""
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = CliRunner().invoke(main, [
        "bench", "--n-dim", "8", "--n-rows", "64", *(f"--kernel={k}" for k in KERNELS),
        "--dtype", "f32",
        "--dtype", "bf16", "--baseline", "cupy,torch", "--repeat", "50", "--json-file", str(out),
        "--plot", str(png)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert [(r["kernel"], r["provider"], r["reduction"], r["dtype"]) for r in rows] == [
        (*row, t) for t in ("f32", "bf16") for row in timed_rows()]
    assert set(rows[0]) == {f.name for f in dataclasses.fields(bench.BenchRow)}
    for r in rows:
        assert r["gb_per_s"] == pytest.approx(
            _bytes(r["kernel"], r["dtype"], 64, 8, r["reduction"]) / (np.median(FAKE) * 1e-3) / 1e9,
            rel=1e-12)
        assert (r["n_rows"], r["n_dim"], r["gpu"]) == (64, 8, fake_cupy.NAME)
        assert r["static"] == {"kernel_id": kernel_classes()[r["kernel"]].for_n_dim(8, r["dtype"]).id,
                               **STATIC}
    table = result.stdout.splitlines()
    assert table[0].split() == ["kernel", "provider", "dtype", "reduction", "shape", "median_ms",
                                "p20_ms",
                                "p80_ms", "gb_per_s", "pct_of_copy", "cek_speedup", "first_s",
                                "launches", "kernels", "peak_mem",
                                "rounds", "occ%", "inflight/SM", "need/SM"]
    # Each kernel's rows as timed, then its static line, after its timings.
    assert [line.split()[:3] for line in table[1:]] == [
        [k, p, t] for t in ("f32", "bf16") for k in KERNELS
        for p in [p for k2, p, _ in timed_rows() if k2 == k] + ["(static)"]]
    # fused bf16 as a mean (PyTorch's training step): 4*2*64*8 + 3*4*64 bytes (y read, the loss
    # and the labels' copy written), and the mean's 4*64 + 2, over a copy of 2*2*64*8*2: 125.0%
    # (the per-row arrays count at this size). Then a wall-clock time, and no launch count or
    # memory: the stand-in's torch has no CUDA.
    assert ["fused", "torch", "bf16", "mean", "64x8", "0.3000", "0.1800", "0.4200", "0", "125.0",
            "1.00x"] in [line.split()[:11] for line in table]
    start, end = table[0].index("launches"), table[0].index("rounds")  # their columns
    assert all(line[start:end].split() == ["-", "-", "-"] for line in table[1:]
               if "(static)" not in line)
    assert all(r["launches"] is r["kernels"] is r["peak_bytes"] is None for r in rows)
    # cek's fused rows alone and as a mean read apart, as in the JSON.
    assert [line.split()[:4] for line in table[1:] if "(static)" not in line] == [
        [r["kernel"], r["provider"], r["dtype"], r["reduction"]] for r in rows]
    assert ["fused", "(static)", "bf16", "64x8", "2", "75", "48K", "8K"] in [
        line.split() for line in table]
    # The static columns sit under their headings: the line of figures and the header align.
    static_line = next(line for line in table if "(static)" in line)
    assert static_line.index("48K") == table[0].index("inflight/SM")
    assert png.read_bytes()[:4] == b"\x89PNG"


def _off_by_one(monkeypatch):
    """The CuPy baseline's per-row loss made wrong by 1; its gradients stay right."""
    right = bench_providers.cupy_math

    def wrong(*args, **kwargs):
        loss, dx1, dx2 = right(*args, **kwargs)
        return loss + 1, dx1, dx2

    monkeypatch.setattr(bench_providers, "cupy_math", wrong)


@pytest.mark.emulator
def test_a_wrong_provider_is_reported_and_not_timed(standin, monkeypatch, tmp_path):
    _off_by_one(monkeypatch)
    rows, failures = bench.run_bench(KERNELS, 64, 8, ["cek", "cupy"], 50, log=lambda m: None,
                                     dtype="bf16")
    # The backward kernel is judged on its gradients alone, which are right.
    assert sorted(map(_short, failures)) == [("forward", "cupy"), ("forward-rows", "cupy"),
                                             ("fused", "cupy")]
    assert failures[0].startswith("cosine_embedding_loss_forward__bf16__8 cupy 64x8: wrong "
                                  "result: out[")
    assert sorted((r.kernel, r.provider) for r in rows) == [
        ("backward", "cek"), ("backward", "cupy"), ("backward-keep", "cek"),
        ("backward-keep", "cek"), ("backward-rows", "cek"), ("backward-rows", "cupy"),
        ("forward", "cek"), ("forward-rows", "cek"), ("fused", "cek"), ("fused", "cek")]
    assert standin.elapsed_reads == 50 * (1 + 10)  # the copy and the ten right rows

    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--n-dim", "8", "--n-rows", "64", "--kernel",
                                       "forward", "--baseline", "cupy", "--repeat", "50",
                                       "--json-file", str(out)])
    assert result.exit_code == 1
    assert "FAIL cosine_embedding_loss_forward__f32__8 cupy 64x8: wrong result: out[" in \
        result.stderr
    assert [(r["kernel"], r["provider"]) for r in json.loads(out.read_text())] == [
        ("forward", "cek")]


@pytest.mark.emulator
def test_nothing_timed_and_a_raising_baseline_still_report(standin, monkeypatch):
    """With every provider refused the CLI prints no table but the failures; a baseline that
    raises is a failure of its own, and the rest of the run goes on."""
    right = bench.check_provider
    monkeypatch.setattr(bench, "check_provider", lambda *args: ["made up"])
    result = CliRunner().invoke(main, ["bench", "--n-dim", "8", "--n-rows", "64", "--kernel",
                                       "forward", "--baseline", "none", "--repeat", "50"])
    assert result.exit_code == 1 and result.stdout == ""
    assert "FAIL cosine_embedding_loss_forward__f32__8 cek 64x8: wrong result: made up" in \
        result.stderr

    monkeypatch.setattr(bench, "check_provider", right)

    def broken(*args, **kwargs):
        raise FloatingPointError("no")

    monkeypatch.setattr(bench_providers, "cupy_math", broken)
    rows, failures = bench.run_bench(["forward"], 64, 8, ["cek", "cupy"], 50, log=lambda m: None)
    assert failures == ["cosine_embedding_loss_forward__f32__8 cupy 64x8: raised "
                        "FloatingPointError: no, not timed"]
    assert [r.provider for r in rows] == ["cek"]


@pytest.mark.emulator
def test_a_failing_torch_compile_costs_only_its_own_rows(standin, monkeypatch):
    """torch.compile failing (no C compiler, say) where the backward graph is built: a reported
    failure of that provider, not the end of the width."""
    import torch

    def broken_compile(fn, **kwargs):
        def compiled(*args, **kwargs):
            raise RuntimeError("planted: no working C compiler")
        return compiled

    monkeypatch.setattr(torch, "compile", broken_compile)
    rows, failures = bench.run_bench(["backward", "fused"], 64, 8, ["cek", "torch-compile"], 50,
                                     log=lambda m: None)
    assert [(r.kernel, r.provider) for r in rows] == [("backward", "cek"), ("fused", "cek"),
                                                     ("fused", "cek")]
    assert [_short(f) for f in failures] == [("backward", "torch-compile"),
                                             ("fused", "torch-compile")]
    assert all("raised RuntimeError: planted: no working C compiler, not timed" in f
               for f in failures)


@pytest.mark.emulator
def test_each_row_carries_the_static_report_of_its_kernel_and_shape(standin, monkeypatch, capsys):
    calls = []

    def static_row(kernel, n_rows, n_dim, *, arch, gpu):
        calls.append((kernel.id, n_rows, n_dim, arch, gpu))
        return {"registers": len(calls)}

    _static_report(monkeypatch, static_row)
    seen = []
    rows, _ = bench.run_bench(
        ["forward", "fused"], 64, 8, ["cek", "cupy"], 50, log=lambda m: None, dtype="bf16",
        on_row=lambda r: seen.append((r.kernel, r.provider, r.static)),
        on_static=lambda rs: seen.append([(r.kernel, r.provider, r.static) for r in rs]))
    # Once per kernel; the stand-in has no compute capability and is no A100/H100/H200.
    assert calls == [(kernel_classes()[k].for_n_dim(8, "bf16").id, 64, 8, "sm_90", None)
                     for k in ("forward", "fused")]
    assert [(r.kernel, r.provider, r.static) for r in rows] == [
        ("forward", "cek", {"registers": 1}), ("forward", "cupy", {"registers": 1}),
        ("fused", "cek", {"registers": 2}), ("fused", "cek", {"registers": 2}),
        ("fused", "cupy", {"registers": 2})]
    # Each row handed over as soon as it is timed, then the kernel's rows together with the
    # figures of the static report, which comes after the kernel's timings so that it can
    # cost none of them.
    assert seen == [("forward", "cek", None), ("forward", "cupy", None),
                    [("forward", "cek", {"registers": 1}), ("forward", "cupy", {"registers": 1})],
                    ("fused", "cek", None), ("fused", "cek", None), ("fused", "cupy", None),
                    [("fused", "cek", {"registers": 2}), ("fused", "cek", {"registers": 2}),
                     ("fused", "cupy", {"registers": 2})]]
    assert capsys.readouterr().err == ""

    # Without the report module, or when it fails: None, said once on stderr, timed anyway.
    for static_row, said in ((None, "cek.report is missing"),
                             (lambda *a, **k: 1 / 0, "ZeroDivisionError")):
        _static_report(monkeypatch, static_row)
        handed = []
        rows, _ = bench.run_bench(["forward"], 64, 8, ["cek", "cupy"], 50, log=lambda m: None,
                                  on_static=handed.append)
        assert [(r.provider, r.static) for r in rows] == [("cek", None), ("cupy", None)]
        assert handed == [rows]  # handed over all the same, so the CLI prints them
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith("cek bench: no static report") and said in line


def _row(n_dim: int, provider: str = "cek") -> bench.BenchRow:
    return bench.BenchRow("fused", provider, "f32", 64, n_dim, "none", 1.0, 0.9, 1.1, 100.0,
                          50.0, None, 200.0, 0.5, None, "test", {}, "now")


def test_a_sweep_cut_short_keeps_every_row_it_timed(monkeypatch, tmp_path):
    """Rows are written (and printed) one by one: a run ended inside a width, as a timeout's
    signal would end it, keeps the rows timed before, that width's included."""
    from cek import gpu

    def run_bench(kernels, n_rows, n_dim, providers, repeat, margin, **callbacks):
        callbacks["on_row"](_row(n_dim))
        if n_dim == 768:
            raise KeyboardInterrupt  # the torch baseline hangs after cek's row
        callbacks["on_row"](_row(n_dim, "torch"))
        return [], []

    monkeypatch.setattr(gpu, "device_count", lambda: 1)
    monkeypatch.setattr(bench, "run_bench", run_bench)
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--n-dim", "128", "--n-dim", "768",
                                       "--json-file", str(out), "--baseline", "torch"])
    assert result.exit_code != 0
    assert [(r["n_dim"], r["provider"]) for r in json.loads(out.read_text())] == [
        (128, "cek"), (128, "torch"), (768, "cek")]
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [
        ["kernel", "provider"], ["fused", "cek"], ["fused", "torch"], ["fused", "cek"]]


def test_json_flag_prints_an_array_and_widths_run_once(monkeypatch, tmp_path):
    from cek import gpu

    widths = []

    def run_bench(kernels, n_rows, n_dim, providers, repeat, margin, on_row, on_static,
                  **callbacks):
        widths.append(n_dim)
        row = _row(n_dim)
        on_row(row)
        row.static = {"width": n_dim}  # printed with --json only once attached
        on_static([row])
        return [], []

    monkeypatch.setattr(gpu, "device_count", lambda: 1)
    monkeypatch.setattr(bench, "run_bench", run_bench)
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--n-dim", "8", "--n-dim", "16", "--n-dim", "8",
                                       "--json", "--json-file", str(out)])
    assert result.exit_code == 0, result.output
    assert widths == [8, 16]
    assert json.loads(result.stdout) == json.loads(out.read_text())
    assert [(r["n_dim"], r["static"]) for r in json.loads(result.stdout)] == [
        (8, {"width": 8}), (16, {"width": 16})]


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_only_on_a_terminal(monkeypatch, terminal):
    """What runs now goes to the bar (drawn on a terminal: tests/test_cli.py runs it on one),
    never as lines of its own; piped, stderr stays empty. Under CliRunner stderr is no terminal
    even when said to be, and click's bar then writes its label once."""
    from cek import cli, gpu

    def run_bench(kernels, n_rows, n_dim, providers, repeat, margin, log, **callbacks):
        log(f"timing {n_dim}")
        return [], []

    monkeypatch.setattr(gpu, "device_count", lambda: 1)
    monkeypatch.setattr(bench, "run_bench", run_bench)
    monkeypatch.setattr(cli, "_stderr_is_terminal", lambda: terminal)
    result = CliRunner().invoke(main, ["bench", "--n-dim", "8", "--baseline", "none"])
    assert result.exit_code == 0
    assert result.stderr == ("timing\n" if terminal else "")


@pytest.mark.emulator
def test_json_rows_carry_their_static_figures_on_the_stand_in(standin):
    result = CliRunner().invoke(main, ["bench", "--n-dim", "8", "--n-rows", "64", "--kernel",
                                       "forward", "--kernel", "fused", "--baseline", "cupy",
                                       "--repeat", "50", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["kernel"], r["provider"], r["reduction"]) for r in rows] == [
        ("forward", "cek", "none"), ("forward", "cupy", "none"), ("fused", "cek", "none"),
        ("fused", "cek", "mean"), ("fused", "cupy", "none")]
    assert [r["static"] for r in rows] == [
        {"kernel_id": kernel_classes()[k].for_n_dim(8, "f32").id, **STATIC}
        for k in ("forward", "forward", "fused", "fused", "fused")]


@pytest.mark.emulator
def test_a_report_without_a_figure_shows_a_dash_and_costs_no_row(standin, monkeypatch):
    """No nvdisasm (sass None), or a report that lacks a figure: "-" in its column; a report
    that fails: no static line, the warning once, every row timed."""
    _static_report(monkeypatch, lambda kernel, n_rows, n_dim, *, arch, gpu: {
        **STATIC, "sass": None, "bytes_in_flight_per_sm": None, "occupancy": "?"})
    args = ["bench", "--n-dim", "8", "--n-rows", "64", "--kernel", "forward", "--baseline",
            "none", "--repeat", "50"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].split() == ["forward", "(static)", "f32", "64x8", "-",
                                                      "-", "-", "8K"]

    _static_report(monkeypatch, lambda *a, **k: 1 / 0)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert [line.split()[:2] for line in result.stdout.splitlines()] == [
        ["kernel", "provider"], ["forward", "cek"]]
    assert result.stderr.startswith("cek bench: no static report for "
                                    "cosine_embedding_loss_forward__f32__8: ZeroDivisionError")


@pytest.mark.emulator
def test_the_training_step_through_cek_torch_is_timed_and_judged(standin, monkeypatch):
    """cek-torch and cek-torch-compile time a training step through cek.torch (on the stand-in
    its CPU path, on CPU tensors; torch.compile left out, as it would compile C++), judged on
    the gradients and on the mean against the float64 mean of every row. cek-torch-graph needs
    torch's CUDA. A step off by 1% is refused."""
    import torch

    import cek.torch as ct

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    wanted = ["cek", "torch", *bench.CEK_TORCH_PROVIDERS]
    assert bench.present(wanted) == ["cek", "torch", "cek-torch", "cek-torch-compile"]
    rows, failures = bench.run_bench(["fused", "forward"], 64, 8, wanted, 50, log=lambda m: None,
                                     dtype="bf16")
    assert failures == []
    assert [(r.kernel, r.provider, r.reduction) for r in rows] == [
        ("fused", "cek", "none"), ("fused", "cek", "mean"), ("fused", "torch", "mean"),
        ("fused", "cek-torch", "mean"), ("fused", "cek-torch-compile", "mean"),
        ("forward", "cek", "none"), ("forward", "torch", "none")]
    mean_bytes = _bytes("fused", "bf16", 64, 8, "mean")
    assert all(r.gb_per_s == pytest.approx(mean_bytes / (np.median(FAKE) * 1e-3) / 1e9)
               for r in rows if r.reduction == "mean")

    right = ct.cosine_embedding_loss
    monkeypatch.setattr(ct, "cosine_embedding_loss", lambda *a, **k: 1.01 * right(*a, **k))
    rows, failures = bench.run_bench(["fused"], 64, 8, ["cek", "cek-torch"], 50,
                                     log=lambda m: None)
    assert [r.provider for r in rows] == ["cek", "cek"]
    assert len(failures) == 1 and failures[0].startswith(
        "cosine_embedding_loss_fused__f32__8 cek-torch 64x8 mean: wrong result: ")


def test_the_users_preset_times_the_step_at_the_users_shapes(monkeypatch):
    """--preset users: the fused kernel's training step at the six shapes, float32 and bfloat16,
    beside torch eager and torch.compile, through cek.torch eager, compiled and from a CUDA
    graph; --dtype and --baseline still choose."""
    calls = bench_calls(monkeypatch, ["--preset", "users"])
    shapes = [(16, 768), (64, 768), (128, 1024), (512, 2048), (4096, 768), (8192, 4096)]
    providers = ("cek", "torch", "torch-compile", "cek-torch", "cek-torch-graph",
                 "cek-torch-compile")
    assert calls == [(("fused",), n, d, providers, t) for t in ("f32", "bf16") for n, d in shapes]
    # every provider but cek's raw kernel times the step: the mean and its backward
    fused = kernel_classes()["fused"]
    assert all(bench.reductions(fused.for_n_dim(d, t), p, n, d) == ("mean",)
               for _, n, d, _, t in calls for p in providers[1:])
    calls = bench_calls(monkeypatch, ["--preset", "users", "--dtype", "bf16",
                                      "--baseline", "torch,cek-torch"])
    assert calls == [(("fused",), n, d, ("cek", "torch", "cek-torch"), "bf16") for n, d in shapes]


@pytest.mark.parametrize("args, message", [
    (["--preset", "users", "--n-dim", "8"], "--preset names its shapes and kernels: leave out "
                                            "--n-dim"),
    (["--preset", "users", "--n-rows", "8", "--kernel", "forward"],
     "--preset names its shapes and kernels: leave out --n-rows, --kernel"),
    ([], "give --n-dim (repeatable) or --preset"),
    (["--preset", "everyone"], "Invalid value for '--preset': unknown preset 'everyone'; choose "
                               "from users"),
])
def test_bench_preset_usage_errors(monkeypatch, args, message):
    from cek import gpu

    monkeypatch.setattr(gpu, "device_count", lambda: pytest.fail("asked for a device"))
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 2
    assert _error_line(result) == f"Error: {message}"


class _Event:
    def __init__(self, name, device_type):
        self.name, self.device_type = name, device_type


def test_launches_are_counted_from_the_profilers_events():
    torch = pytest.importorskip("torch")
    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    events = [_Event("aten::mul", cpu), _Event("cudaLaunchKernel", cpu), _Event("mul_kernel", cuda),
              _Event("cuLaunchKernel", cpu), _Event("cek_fused", cuda),
              _Event("cudaGraphLaunch", cpu), _Event("cudaMemsetAsync", cpu),
              _Event("Memset (Device)", cuda), _Event("cudaStreamSynchronize", cpu)]
    assert bench.count_launches(events) == (4, 3)


def _fake_cuda(monkeypatch, torch, held: dict):
    """torch.cuda's memory statistics as a fake allocator keeps them: held["now"] bytes now,
    held["peak"] the most since the last reset."""
    def reset():
        held["peak"] = held["now"]

    for name, value in (("synchronize", lambda: None), ("reset_peak_memory_stats", reset),
                        ("memory_allocated", lambda: held["now"]),
                        ("max_memory_allocated", lambda: held["peak"]),
                        ("is_available", lambda: True)):
        monkeypatch.setattr(torch.cuda, name, value)


def test_a_steps_peak_is_above_what_it_starts_with(monkeypatch):
    """The gradients of the step before are released before the count starts (the step itself
    releases them first: counted, they would hide that much of its peak); a graph's replay
    gives its capture's figure; a run that is not a step none."""
    torch = pytest.importorskip("torch")
    held = {"now": 5000, "peak": 0}
    _fake_cuda(monkeypatch, torch, held)
    x1, x2 = torch.ones(2, 3, requires_grad=True), torch.ones(2, 3, requires_grad=True)
    x1.grad, x2.grad = torch.ones(2, 3), torch.ones(2, 3)

    def step():
        held["peak"] = max(held["peak"], held["now"] + 700)  # 700 bytes at its peak
        held["now"] += 96  # and 96 of them kept

    step.leaves = (x1, x2)
    seen = []
    monkeypatch.setattr(torch.cuda, "memory_allocated",
                        lambda: seen.append((x1.grad, x2.grad)) or held["now"])
    assert bench.step_peak_bytes(torch, step) == 700
    assert seen == [(None, None)]

    def replay():
        pass

    replay.peak_bytes = 123
    assert bench.step_peak_bytes(torch, replay) == 123
    assert bench.step_peak_bytes(torch, lambda: None) is None


@pytest.mark.emulator
def test_launches_and_memory_reach_the_json_and_the_table(standin, monkeypatch, tmp_path):
    """Where torch has CUDA, each row carries its run's launches and kernels and a step's peak
    memory, in the JSON and in the table. Here the profiler's count is the stand-in's launches
    during one run, and the allocator a fake one whose step peaks 12345 bytes above its start:
    cek's raw rows (CuPy's memory, not torch's) have no peak."""
    import torch

    held = {"now": 0, "peak": 0}
    _fake_cuda(monkeypatch, torch, held)
    # whatever runs after a reset peaks 12345 bytes above what was held at the reset
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda: held.update(peak=held["now"] + 12345))
    monkeypatch.setattr(bench_providers, "present", lambda wanted: ["cek", "torch", "cek-torch"])

    def step_counts(torch, run):
        before = len(standin.launches)
        run()
        return len(standin.launches) - before, 2 * (len(standin.launches) - before)

    monkeypatch.setattr(bench, "step_counts", step_counts)
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--n-dim", "8", "--n-rows", "64", "--kernel",
                                       "fused", "--baseline", "torch,cek-torch", "--repeat", "50",
                                       "--json-file", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    # cek's fused kernel alone: one launch; as a mean: the reduction after it; the steps on CPU
    # tensors launch nothing on the stand-in (torch's and cek.torch's CPU path)
    assert [(r["provider"], r["reduction"], r["launches"], r["kernels"], r["peak_bytes"])
            for r in rows] == [("cek", "none", 1, 2, None), ("cek", "mean", 2, 4, None),
                               ("torch", "mean", 0, 0, 12345), ("cek-torch", "mean", 0, 0, 12345)]
    table = [line for line in result.stdout.splitlines() if "(static)" not in line]
    start, end = table[0].index("launches"), table[0].index("rounds")  # their columns
    assert [line[start:end].split() for line in table[1:]] == [
        ["1", "2", "-"], ["2", "4", "-"], ["0", "0", "12.1K"], ["0", "0", "12.1K"]]
