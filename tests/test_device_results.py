"""cpu tier (the static figures computed after the run need NVRTC and nvdisasm: compile tier):
scripts/device_results.py turns a device_check.sh output folder into benchmarks/results/ and the
table of benchmarks/README.md, on a planted folder of a first run that lost steps."""

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import script_module

ROOT = Path(__file__).resolve().parents[1]
GPU = "NVIDIA H200"


def _results():
    return script_module("device_results")


def _row(run, kernel="fused", provider="cek", static=True, **fields):
    row = {"kernel": kernel, "provider": provider, "dtype": "f32", "n_rows": 65536,
           "n_dim": 768, "reduction": "none", "median_ms": 0.25, "p20_ms": 0.24, "p80_ms": 0.26,
           "gb_per_s": 3000.0, "pct_of_copy": 75.0, "speedup_of_cek": None,
           "copy_gb_per_s": 4000.0, "first_call_s": 0.4, "gpu": GPU,
           "static": {"occupancy": 0.5, "waves": 2.0, "sass": {"load_rounds": 3},
                      "bytes_in_flight_per_sm": 40960,
                      "needed_bytes_in_flight_per_sm": 20480} if static else None,
           "versions": {"cek": "0.1.0"}, "timestamp": "2031-05-06T07:08:09", "run": run}
    return {**row, **fields}


def _planted(tmp_path, rows, steps):
    out = tmp_path / "out"
    out.mkdir()
    (out / "steps.log").write_text("".join(f"{name}: {outcome}\n" for name, outcome in steps))
    if rows is not None:
        (out / "bench.json").write_text(json.dumps(rows))
    into = tmp_path / "benchmarks"
    into.mkdir()
    shutil.copy(ROOT / "benchmarks" / "README.md", into / "README.md")
    return out, into


STEPS = [("doctor", "exit 0 after 6s"), ("compile", "exit 0 after 9s"),
         ("cek_768", "exit 0 after 20s"), ("cek_4096", "killed by its 16s timeout after 19s"),
         ("cek_128", "exit 1 after 3s"), ("gpu_tests", "exit 1 after 50s")]


def test_a_first_run_that_lost_steps_is_committed_with_what_it_has(tmp_path):
    rows = [_row("cek_768"), _row("cek_768", provider="torch", speedup_of_cek=1.8, static=None),
            _row("cek_4096", n_rows=8192, n_dim=4096)]
    out, into = _planted(tmp_path, rows, STEPS)
    assert _results().main([str(out), "--into", str(into)]) == 0
    result = json.loads((into / "results" / "2031-05-06-nvidia-h200.json").read_text())
    assert result["gpu"] == GPU and len(result["rows"]) == 3
    assert result["steps"]["cek_4096"].startswith("killed by its 16s timeout")
    readme = (into / "README.md").read_text()
    assert "No run yet." not in readme and readme.count("<!-- /results -->") == 1
    assert readme.startswith("# Benchmarks")  # the text above the table is kept
    assert "- cek_4096: killed by its 16s timeout after 19s" in readme
    assert "- cek_128: exit 1 after 3s" in readme and "- gpu_tests: exit 1 after 50s" in readme
    assert "- no row from: cek_128" in readme  # a bench step that timed nothing
    # measured beside the model: 75 % of copy, rounds 3, occupancy 50 %, 40K in flight of 20K
    assert ("| cek_768 | fused | cek | f32 | none | 65536x768 | 0.2500 | 3000 | 75.0 |  | 3 | 50 "
            "| 2.00 | 40K | 20K |") in readme
    assert ("| cek_768 | fused | torch | f32 | none | 65536x768 | 0.2500 | 3000 | 75.0 | 1.80x "
            "| - | - | - | - | - |") in readme  # a baseline's row has no static figures
    # a second run's table replaces the first's
    assert _results().main([str(out), "--into", str(into)]) == 0
    assert (into / "README.md").read_text() == readme


@pytest.mark.compile
def test_a_row_killed_before_its_static_figures_gets_them_after_the_run(tmp_path):
    pytest.importorskip("cuda.bindings")
    from cek import report, sass
    from cek.kernel import kernel_classes

    if sass.find_nvdisasm() is None:
        pytest.skip("compile tier: nvdisasm is needed for the static figures")
    out, into = _planted(tmp_path, [_row("torch_compile", static=False)], STEPS)
    assert _results().main([str(out), "--into", str(into)]) == 0
    row, = json.loads((into / "results" / "2031-05-06-nvidia-h200.json").read_text())["rows"]
    expected = report.static_row(kernel_classes()["fused"].for_n_dim(768), 65536, 768)
    assert row["static"]["occupancy"] == expected["occupancy"] and row["static"]["sass"]
    assert row["static_computed_after_the_run"] is True


def test_a_run_killed_before_its_summary_still_gives_its_steps(tmp_path, capsys):
    out, into = _planted(tmp_path, None, STEPS[:3])
    assert _results().main([str(out), "--into", str(into)]) == 0
    readme = (into / "README.md").read_text()
    assert "unknown GPU" in readme and ": 0 rows." in readme
    assert "- no row from: cek_768" in readme
    assert "no rows from" in capsys.readouterr().err


def test_a_run_stopped_by_a_kill_keeps_the_rows_its_stopped_step_timed(tmp_path):
    # bench.json was last written when cek_768 ended; cek_4096 was stopped by a KILL after its
    # first row, which only its part holds (scripts/device_check.sh writes parts/ row by row).
    out, into = _planted(tmp_path, [_row("cek_768")], STEPS[:3])
    parts = out / "parts"
    parts.mkdir()
    (parts / "cek_768.json").write_text(json.dumps([_row("cek_768")]))
    (parts / "cek_4096.json").write_text(json.dumps([_row("cek_4096", n_rows=8192, n_dim=4096)]))
    for second, name in enumerate(("cek_768", "cek_4096")):  # in the order the steps ran
        os.utime(parts / f"{name}.json", (1e9 + second, 1e9 + second))
    assert _results().main([str(out), "--into", str(into)]) == 0
    result = json.loads((into / "results" / "2031-05-06-nvidia-h200.json").read_text())
    assert [(row["run"], row["n_dim"]) for row in result["rows"]] == [("cek_768", 768),
                                                                       ("cek_4096", 4096)]


def test_a_rehearsal_or_an_empty_folder_is_refused(tmp_path, capsys):
    out, into = _planted(tmp_path, [_row("cek_768", gpu="Stand-in GPU (NumPy and the cek "
                                                    "emulator)")], STEPS)
    assert _results().main([str(out), "--into", str(into)]) == 1
    assert "is a rehearsal" in capsys.readouterr().err
    assert not (into / "results").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _results().main([str(empty), "--into", str(into)]) == 2
    assert f"{empty} holds no steps.log" in capsys.readouterr().err
