"""cpu tier: scripts/device_check.sh, the one run on a lent GPU, is checked here before it gets
there: every `cek bench` call in it parses, its step timeouts fit its 6-minute budget, cek is
timed before any baseline; and (emulator tier) the whole script runs on the stand-in for CuPy
with a slow and a hanging provider planted, and still comes back with its figures.

Run as a program, this file is the Python the script is given in that test (CEK_PYTHON): it
runs `-m cek bench` on the stand-in, shrunk to one small width, with the plants of CEK_PLANT.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device_check.sh"
BUDGET_S = 360


def _lines() -> list[str]:
    """The script's lines with backslash continuations joined."""
    return SCRIPT.read_text().replace("\\\n", " ").splitlines()


def _steps() -> list[tuple[str, str, int, list[str]]]:
    """(kind, name, timeout, arguments) of every `step`/`bench NAME TIMEOUT ...` line, in order."""
    dims = next(re.fullmatch(r'DIMS="(.*)"', line)[1] for line in _lines()
                if line.startswith("DIMS="))
    steps = []
    for line in _lines():
        if re.match(r"(step|bench) \w+ \d+ ", line):
            kind, name, limit, *args = shlex.split(line.replace("$DIMS", dims))
            steps.append((kind, name, int(limit), [a.replace("$OUT", "out") for a in args]))
    return steps


def _bench_calls() -> list[tuple[str, int, list[str]]]:
    return [(name, limit, args) for kind, name, limit, args in _steps() if kind == "bench"]


def test_the_step_timeouts_fit_the_budget():
    # Every command that can hang runs in a step: the only `timeout` is the one in step().
    assert [line.strip() for line in _lines() if re.match(r"\s*timeout ", line)] == [
        'timeout -k "$KILL_AFTER_S" "$limit" "$@"']
    assert [name for kind, name, _, _ in _steps() if kind == "step"] == [
        "preflight", "gpu_tests", "train_step"]
    assert sum(limit for _, _, limit, _ in _steps()) <= BUDGET_S


def _function(name: str) -> str:
    """The text of the script's shell function `name`, to run on its own."""
    return re.search(rf"^{name}\(\) \{{.*?^\}}$", SCRIPT.read_text(), re.M | re.S)[0]


def _path_without_compilers(tmp_path: Path) -> str:
    """A PATH with the tools the script's functions use, and no cc, gcc, g++ or nvidia-smi."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "head", "cat", "sleep", "timeout", "env", "grep", "tee", "mktemp"):
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    return str(tools)


def test_preflight_names_each_missing_piece(tmp_path):
    # Under `bash -c preflight` the script's pipefail does not hold: a check written as
    # `cc --version | head -1 || echo MISSING` takes head's status and can never say MISSING.
    done = subprocess.run(["bash", "-c", _function("preflight") + "\npreflight"],
                          env={"PATH": _path_without_compilers(tmp_path), "PY": sys.executable,
                               "PYTHONPATH": str(SCRIPT.parents[1])},
                          capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    for cc in ("cc", "gcc", "g++"):
        assert f"MISSING C compiler {cc}" in lines, done.stdout + done.stderr
    assert "MISSING nvidia-smi" in lines
    # the static figures' NVRTC binding and disassembler, present here
    assert any(line.startswith("cuda.bindings ") for line in lines), done.stdout
    from cek import sass
    assert f"nvdisasm {sass.find_nvdisasm()}" in lines


def test_a_step_that_ignores_its_timeout_is_killed(tmp_path):
    # timeout -k: TERM at the limit, KILL KILL_AFTER_S later; steps.log says it was killed.
    script = "\n".join(["status=0", _function("step"),
                        "step stubborn 1 bash -c 'trap \"\" TERM; sleep 30'", "exit $status"])
    start = time.monotonic()
    done = subprocess.run(["bash", "-c", script], env={
        "PATH": _path_without_compilers(tmp_path), "OUT": str(tmp_path), "KILL_AFTER_S": "1"},
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and time.monotonic() - start < 20, done.stderr
    assert (tmp_path / "steps.log").read_text().startswith(
        "stubborn: killed by its 1s timeout after "), done.stderr


def _baselines(args: list[str]) -> str:
    return args[args.index("--baseline") + 1]


def test_cek_is_timed_first_and_torch_compile_alone():
    calls = _bench_calls()
    first = [name for name, _, args in calls].index(
        next(name for name, _, args in calls if _baselines(args) != "none"))
    # The target shapes, cek alone (with the copy), before the gpu tier and any baseline.
    assert {(args[args.index("--n-dim") + 1], args[args.index("--n-rows") + 1])
            for _, _, args in calls[:first]} == {("768", "65536"), ("4096", "8192"),
                                                 ("128", "1048576")}
    assert [_baselines(args) for _, _, args in calls[:first]] == ["none"] * first
    names = [name for _, name, _, _ in _steps()]
    assert names.index("gpu_tests") == first + 1
    assert [name for name, _, args in calls if "torch-compile" in _baselines(args)] == [
        "torch_compile"]
    assert _baselines(dict((n, a) for n, _, a in calls)["torch_compile"]) == "torch-compile"


@pytest.mark.parametrize("name, limit, args", _bench_calls(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_bench_call_parses(monkeypatch, tmp_path, name, limit, args):
    # With no device, cek bench exits 1 after checking its options: the "no CUDA device" line
    # shows they all parsed (a bad option exits 2, with another message).
    from cek import gpu
    from cek.cli import main

    monkeypatch.setattr(gpu, "device_count", lambda: 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    result = CliRunner().invoke(main, ["bench", *args, "--json-file", "unused.json"])
    assert result.exit_code == 1, result.output
    assert "no CUDA device" in result.stderr, result.stderr


# -- the whole script on the stand-in ------------------------------------------------------------

HANG_LIMIT_S = 10  # the hanging step's timeout in the test: time enough to time cek's row first
SLOW_S = 1.0


@pytest.mark.emulator
def test_a_run_with_a_slow_and_a_hanging_provider_keeps_its_figures(tmp_path):
    """device_check.sh end to end: CuPy is the stand-in (tests/fake_cupy.py) with the emulator
    as the GPU, every width is 8 and every row count 64 (the kernels' emulator builds are shared
    with tests/test_bench.py), torch.compile is left out (it would compile C++ for minutes), and
    the gpu tier is not run. Planted: the CuPy baseline takes SLOW_S more in its first call, and
    torch.compile's provider hangs until its step's timeout kills it."""
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "CEK_PYTHON": str(python),
           "CEK_PLANT": f"cupy={SLOW_S},torch-compile=hang",
           "LIMIT_torch_compile": str(HANG_LIMIT_S)}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # the killed step

    outcome = dict(line.split(": ", 1) for line in (out / "steps.log").read_text().splitlines())
    names = [name for _, name, _, _ in _steps()]
    assert list(outcome) == names
    assert outcome.pop("torch_compile").startswith(f"killed by its {HANG_LIMIT_S}s timeout")
    assert all(v.startswith("exit 0 ") for v in outcome.values()), outcome

    rows = json.loads((out / "bench.json").read_text())
    bench_names = [name for name, _, _ in _bench_calls()]
    assert list(dict.fromkeys(r["run"] for r in rows)) == bench_names  # in the order they ran
    # The hanging step kept the row it timed before the hang: cek's, fused being its first kernel.
    assert [(r["kernel"], r["provider"]) for r in rows if r["run"] == "torch_compile"] == [
        ("fused", "cek")]
    assert {r["provider"] for r in rows if r["run"].startswith("cek_")} == {"cek"}
    slow = [r["first_call_s"] for r in rows if r["provider"] == "cupy"]
    assert slow and min(slow) >= SLOW_S
    # The static figures come after a kernel's timings: the killed step never got its own.
    assert all(r["static"] == (None if r["run"] == "torch_compile" else {"id": r["kernel"]})
               and r["copy_gb_per_s"] > 0 for r in rows)

    tables = (out / "tables.txt").read_text()
    assert tables.count("\nfused  ") >= sum(r["kernel"] == "fused" for r in rows)
    assert (out / "bench_fused.png").read_bytes()[:4] == b"\x89PNG"
    env_txt = (out / "env.txt").read_text()
    assert "== nvidia-smi" in env_txt and '"cek": ' in env_txt
    for line in env_txt.splitlines():  # what is missing here is named, and said at once
        if line.startswith("MISSING"):
            assert line in done.stdout
    assert f"{len(rows)} rows in {out / 'bench.json'}" in done.stdout
    steps = json.loads((out / "train_step.json").read_text())  # CPU tensors: no CUDA graphs
    assert [s["step"] for s in steps] == ["torch eager", "cek eager", "cek eager, weight 3",
                                          "torch.compile", "cek under torch.compile"]
    assert all(s["ms"] > 0 and "error" not in s for s in steps)
    assert "| cek eager | " in tables


def _shrunk(args: list[str]) -> list[str]:
    """`cek bench` arguments at one small width: every --n-dim 8, --n-rows 64, --repeat 50."""
    small = {"--n-dim": "8", "--n-rows": "64", "--repeat": "50"}
    return [small[args[i - 1]] if i and args[i - 1] in small else a for i, a in enumerate(args)]


def _planted(providers_for, plants: dict):
    """providers_for whose planted providers sleep first: so many seconds, or for ever."""

    def planted(*args, **kwargs):
        out = providers_for(*args, **kwargs)
        for name, delay in plants.items():
            if name in out:
                build = out[name]
                out[name] = lambda build=build, delay=delay: (time.sleep(delay), build())[1]
        return out

    return planted


def _standin_bench(args: list[str]) -> None:
    import fake_cupy
    import torch

    from cek import bench
    from cek.cli import main

    patch = pytest.MonkeyPatch()
    fake_cupy.install(patch)
    patch.setattr(bench, "FLUSH_BYTES", 4)
    patch.setattr(bench, "CHECK_ROWS", 6)
    patch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    report = type(sys)("cek.report")
    report.static_row = lambda kernel, n_rows, n_dim, *, arch, gpu: {
        "id": next(k for k, c in bench.kernel_classes().items() if c.name == kernel.name)}
    patch.setitem(sys.modules, "cek.report", report)
    plants = dict(p.split("=") for p in os.environ.get("CEK_PLANT", "").split(",") if p)
    patch.setattr(bench, "providers_for", _planted(bench.providers_for, {
        name: 1e6 if delay == "hang" else float(delay) for name, delay in plants.items()}))
    main(_shrunk(args), prog_name="cek")


if __name__ == "__main__":  # CEK_PYTHON in the end-to-end test
    argv = sys.argv[1:]
    if argv[:3] == ["-m", "cek", "bench"]:
        _standin_bench(argv[2:])
    elif argv[:1] == ["scripts/step_bench.py"]:  # on CPU tensors, tiny, nothing compiled
        import torch

        torch.compile = lambda fn, **kwargs: fn
        json_file = argv[argv.index("--json-file") + 1]
        sys.argv = [argv[0], "--device", "cpu", "--n-rows", "64", "--n-dim", "8", "--repeat", "3",
                    "--json-file", json_file]
        exec(compile(Path(argv[0]).read_text(), argv[0], "exec"), {"__name__": "__main__"})
    elif argv[:2] == ["-m", "pytest"]:
        print("the gpu tier is not run on the stand-in")
    elif argv[:1] == ["-"]:  # the script's inline Python
        sys.argv = argv
        exec(compile(sys.stdin.read(), "<stdin>", "exec"), {"__name__": "__main__"})
    else:
        sys.exit(f"not a command of device_check.sh: {argv}")
