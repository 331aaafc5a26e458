"""`cek bench`: its arithmetic and its CuPy baseline on the CPU; a small real run in the gpu tier."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from cek import bench, check, reference
from cek.cli import main


def test_percentiles_and_bandwidth_arithmetic():
    median, p20, p80 = bench.percentiles([float(i) for i in range(1, 101)])
    assert (median, p20, p80) == (50.5, pytest.approx(20.8), pytest.approx(80.2))
    assert bench.gb_per_s(2_000_000_000, 1000.0) == 2.0


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


def test_bench_without_a_gpu_exits_2_with_one_line(monkeypatch):
    from cek import gpu

    monkeypatch.setattr(gpu, "device_count", lambda: 0)
    result = CliRunner().invoke(main, ["bench", "--n-dim", "768"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "cek bench: no CUDA device; `cek check --device cpu` and `cek compile` work without one"]


@pytest.mark.parametrize("args, message", [
    (["--baseline", "numba"], "unknown baseline 'numba'"),
    (["--n-rows", "-3"], "--n-rows must be a positive integer or 'auto'"),
    (["--repeat", "10"], "10 is not in the range x>=50"),
    (["--dtype", "bf16"], "float32 only"),
])
def test_bench_usage_errors(args, message):
    result = CliRunner().invoke(main, ["bench", "--n-dim", "768", *args])
    assert result.exit_code == 2 and message in result.output


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
                                       "--kernel", "all", "--repeat", "50", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())
    assert {r["provider"] for r in rows} >= {"cek", "cupy"}
    assert all(r["gb_per_s"] > 0 and 0 < r["pct_of_copy"] for r in rows)
    assert {"kernel", "provider", "dtype", "n_rows", "n_dim", "median_ms", "p20_ms", "p80_ms",
            "gb_per_s", "pct_of_copy", "gpu", "versions", "timestamp"} <= set(rows[0])
