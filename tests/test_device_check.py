"""cpu tier: scripts/device_check.sh, the one run on a lent GPU, is checked here before it gets
there: every `cek bench` call in it parses, its step timeouts fit its 8-minute budget, its steps
come in the order a first run needs (every kernel compiled, then cek and the training step at
the target shapes, the gpu tier without its CLI bench test, the baselines, torch.compile last);
and (emulator tier) the whole script runs on the stand-in for CuPy with a slow and a hanging
provider planted, and still comes back with its figures.

Run as a program, this file is the Python the script is given in that test (CEK_PYTHON): it
runs `-m cek bench` on the stand-in, shrunk to one small width, with the plants of CEK_PLANT.
"""

import contextlib
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

from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
from cek.kernel import kernel_classes
from conftest import bench_calls, script_module

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device_check.sh"
BUDGET_S = 480
KILL_AFTER_S = 3  # the script's grace after a step's TERM


def _compile_kernels():
    """scripts/compile_kernels.py as a module."""
    return script_module("compile_kernels")


def _lines() -> list[str]:
    """The script's lines, continuations joined and its variables expanded."""
    return _compile_kernels().script_lines(SCRIPT.read_text())


def _steps() -> list[tuple[str, str, int, list[str]]]:
    """(kind, name, timeout, arguments) of every `step`/`bench NAME TIMEOUT ...` line, in order."""
    steps = []
    for line in _lines():
        if re.match(r"(step|bench) \w+ \d+ ", line):
            kind, name, limit, *args = shlex.split(line)
            steps.append((kind, name, int(limit), [a.replace("$OUT", "out") for a in args]))
    return steps


def _bench_calls() -> list[tuple[str, int, list[str]]]:
    return [(name, limit, args) for kind, name, limit, args in _steps() if kind == "bench"]


def test_the_step_timeouts_fit_the_budget():
    # Every command that can hang runs in a step: the only `timeout` is the one in step().
    assert [line.strip() for line in _lines() if re.match(r"\s*timeout ", line)] == [
        'timeout -k "$KILL_AFTER_S" "$limit" "$@" &']
    assert [name for kind, name, _, _ in _steps() if kind == "step"] == [
        "doctor", "preflight", "compile", "warm", "gpu_tests"]
    # Every step killed, each with its grace, and the summary: under the budget still.
    assert sum(limit + KILL_AFTER_S for _, _, limit, _ in _steps()) + 10 <= BUDGET_S


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


@pytest.mark.parametrize("torch_version, differs", [("2.11.0+cu130", True), ("2.13.0", False)])
def test_preflight_says_first_what_differs_from_what_ci_tests(tmp_path, torch_version, differs):
    # The image's torch (2.11) is below the floor pyproject.toml claims and CI tests: env.txt's
    # first section says so, with what is known to differ there.
    plant = tmp_path / "site" / f"torch-{torch_version}.dist-info"
    plant.mkdir(parents=True)
    (plant / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
    done = subprocess.run(["bash", "-c", _function("preflight") + "\npreflight"], cwd=ROOT,
                          env={**os.environ, "PY": sys.executable,
                               "PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}"},
                          capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("== what differs here from what CI tests"), done.stdout
    floor = re.search(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text())[1]
    found = [line for line in lines if line.startswith("DIFFERS")]
    if differs:
        assert lines[1] == found[0] and len(found) == 1, done.stdout
        assert found[0].startswith(f"DIFFERS torch {torch_version} is below torch>={floor}, ")
        assert "test_ordinary_rows_keep_their_bits fails there (6 cases" in found[0]
    else:
        assert not found and lines[1] == "== nvidia-smi", done.stdout


def test_a_step_that_ignores_its_timeout_is_killed(tmp_path):
    # timeout -k: TERM at the limit, KILL KILL_AFTER_S later; steps.log says it was killed.
    script = "\n".join(["status=0", "summary() { :; }", _function("step"),
                        "step stubborn 1 bash -c 'trap \"\" TERM; sleep 30'", "exit $status"])
    start = time.monotonic()
    done = subprocess.run(["bash", "-c", script], env={
        "PATH": _path_without_compilers(tmp_path), "OUT": str(tmp_path), "KILL_AFTER_S": "1"},
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and time.monotonic() - start < 20, done.stderr
    assert (tmp_path / "steps.log").read_text().startswith(
        "stubborn: killed by its 1s timeout after "), done.stderr


# A Python for the script that runs nothing: each `cek bench` step writes one row, as cek bench
# does (the whole file replaced), every other command ends at once, and the step CEK_CUT_AT,
# once its row is written (a bench step) or at its start, says its pid in CEK_CUT_MARK and waits.
_STEPS_ONLY = """
import json, os, pathlib, sys, time
argv, step = sys.argv[1:], os.environ.get("CEK_STEP", "")
if argv[:3] == ["-m", "cek", "bench"]:
    out = pathlib.Path(argv[argv.index("--json-file") + 1])
    out.with_suffix(".tmp").write_text(json.dumps([{"kernel": "fused", "provider": "cek"}]))
    os.replace(out.with_suffix(".tmp"), out)
elif argv[:1] in (["-"], ["-c"]) and not step:  # the summary, the probe for matplotlib
    sys.argv = argv
    exec(sys.stdin.read() if argv[0] == "-" else argv[1])
if step == os.environ["CEK_CUT_AT"]:
    pathlib.Path(os.environ["CEK_CUT_MARK"]).write_text(str(os.getpid()))
    time.sleep(300)
"""


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("cut_at", ["cek_4096", "gpu_tests", "torch_compile"])
@pytest.mark.parametrize("signal_name", ["TERM", "INT", "KILL"])
def test_a_run_stopped_in_any_step_keeps_every_row_it_timed(tmp_path, cut_at, signal_name):
    """The GPU machine may stop the run at any second. On TERM or INT the running step is
    stopped and named in steps.log, and bench.json holds every row timed until then, the
    stopped step's own among them; on a KILL, which no script can catch, bench.json holds the
    rows of every step that ended, and the stopped step's rows are in parts/."""
    import signal

    from conftest import sigint_as_a_terminal_sends_it

    program = tmp_path / "steps_only.py"
    program.write_text(_STEPS_ONLY)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{program}" "$@"\n')
    python.chmod(0o755)
    out, mark = tmp_path / "out", tmp_path / "cut.pid"
    run = subprocess.Popen(["bash", str(SCRIPT)], env={
        **os.environ, "OUT": str(out), "CEK_PYTHON": str(python), "CEK_CUT_AT": cut_at,
        "CEK_CUT_MARK": str(mark)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_as_a_terminal_sends_it)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists(), run.communicate(timeout=60)
        time.sleep(0.2)  # the pid is written: the step is waiting
        pid = int(mark.read_text())
        run.send_signal(getattr(signal, f"SIG{signal_name}"))
        _, stderr = run.communicate(timeout=30)
        stopped = signal_name == "KILL" or _gone(pid, 10)  # a KILL leaves the step running
    finally:  # nothing of this test's left running, whatever failed
        if run.poll() is None:
            run.kill()
        if mark.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(mark.read_text()), signal.SIGKILL)
    names = [name for _, name, _, _ in _steps()]
    finished = names[:names.index(cut_at)]
    outcome = [line.split(": ", 1) for line in (out / "steps.log").read_text().splitlines()]
    assert [name for name, _ in outcome[:len(finished)]] == finished, outcome
    assert all(o.startswith("exit 0 after ") for _, o in outcome[:len(finished)]), outcome
    bench_names = [name for name, _, _ in _bench_calls()]
    rows = json.loads((out / "bench.json").read_text())
    kept = [name for name in finished if name in bench_names]
    if signal_name == "KILL":
        assert run.returncode == -signal.SIGKILL and len(outcome) == len(finished)
    else:
        assert run.returncode == (143 if signal_name == "TERM" else 130), stderr
        assert outcome[-1][0] == cut_at and len(outcome) == len(finished) + 1, outcome
        assert re.fullmatch(rf"cut by {signal_name} after \d+s", outcome[-1][1]), outcome
        assert stopped, "the stopped step still runs"
        kept += [cut_at] if cut_at in bench_names else []
    assert [row["run"] for row in rows] == kept
    # each bench step's rows in parts/ as it writes them: the stopped one's too, whatever stopped it
    started = {name for name in names[:names.index(cut_at) + 1] if name in bench_names}
    assert {p.stem for p in (out / "parts").glob("*.json")} == started
    assert all(json.loads((out / "parts" / f"{name}.json").read_text()) for name in started)


def test_a_rehearsal_starts_without_an_earlier_ones_verdicts_and_seconds(tmp_path):
    """A rehearsal into an OUT that holds an earlier one's: rehearsal.log starts empty (an old
    FAIL would fail this run) and the seconds it measured are measured again."""
    import signal

    program = tmp_path / "steps_only.py"
    program.write_text(_STEPS_ONLY)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{program}" "$@"\n')
    python.chmod(0o755)
    out, mark = tmp_path / "out", tmp_path / "cut.pid"
    (out / "rehearsal").mkdir(parents=True)
    (out / "rehearsal" / "cupy_s").write_text("9 9")
    (out / "rehearsal.log").write_text("compile: FAIL an earlier run's\n")
    run = subprocess.Popen(["bash", str(SCRIPT), "--rehearse"], env={
        **os.environ, "OUT": str(out), "CEK_PYTHON": str(python), "CEK_CUT_AT": "doctor",
        "CEK_CUT_MARK": str(mark)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not mark.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
        if mark.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(mark.read_text()), signal.SIGKILL)
    assert (out / "rehearsal.log").read_text() == ""
    assert not (out / "rehearsal" / "cupy_s").exists()


def _baselines(args: list[str]) -> str:
    return args[args.index("--baseline") + 1]


def _option(args: list[str], option: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]


def test_the_steps_come_in_the_order_a_first_run_needs():
    names = [name for _, name, _, _ in _steps()]
    assert names[:4] == ["doctor", "preflight", "compile", "warm"]
    del names[3]  # the warm step: cek's steps follow it as they followed the compile
    calls = _bench_calls()
    # cek at the target shapes first, in float32 and bfloat16: the fused kernel (timed alone and
    # as a mean) and the training step through cek.torch, eager and from a CUDA graph, beside
    # torch's eager step; no torch.compile.
    first = [(name, args) for name, _, args in calls if name.startswith("cek_")]
    # the training step at the users' shapes right after the first of them: its figures are
    # what users run (test_the_users_step_times_the_step_at_their_shapes_without_compiling)
    assert names[3:5] == ["cek_768", "users"]
    del names[4]
    assert [name for name, _ in first] == names[3:3 + len(first)]
    assert {(_option(a, "--n-dim")[0], _option(a, "--n-rows")[0]) for _, a in first} == {
        ("768", "65536"), ("4096", "8192"), ("128", "1048576")}
    for _, args in first:
        assert _option(args, "--dtype") == ["f32", "bf16"] and "fused" in _option(args, "--kernel")
        assert _baselines(args).split(",") == ["cek-torch", "cek-torch-graph", "torch"]
    # the step's backward: the keep kernel, kept and recomputing, at the first shape
    assert "backward-keep" in _option(first[0][1], "--kernel")
    # Then the few wide rows, both ways, where the threshold's model puts the crossover: 48 rows
    # of 2^20, 48, 128 and 256 rows of 32768, in float32 and bfloat16, the split's fused and
    # forward pairs beside the one-block kernels.
    split = [(name, args) for name, _, args in calls if name.startswith("split_")]
    assert [name for name, _ in split] == names[3 + len(first):3 + len(first) + len(split)]
    shapes = {(_option(a, "--n-dim")[0], _option(a, "--n-rows")[0]): a for _, a in split}
    assert set(shapes) == {("1048576", "48"), ("32768", "48"), ("32768", "128"),
                           ("32768", "256")}
    for args in shapes.values():
        assert _option(args, "--dtype") == ["f32", "bf16"]
        assert {"fused", "fused-split", "forward-rows", "forward-split"} == \
            set(_option(args, "--kernel"))
    # Then the gpu tier, its CLI bench test (which times what the steps here time) left out.
    gpu_tests = next(args for kind, name, _, args in _steps() if name == "gpu_tests")
    assert names.index("gpu_tests") == 3 + len(first) + len(split)
    assert "tests/test_bench.py::test_bench_runs_checks_and_writes_json" in \
        _option(gpu_tests, "--deselect")
    # torch.compile last and alone: nothing after it can wait on a compile.
    compiled = [i for i, (_, _, args) in enumerate(calls) if "compile" in _baselines(args)]
    assert compiled == [len(calls) - 1] and names[-1] == calls[-1][0]
    assert _baselines(calls[-1][2]) == "torch-compile,cek-torch-compile"
    # float32 alone: each function and dtype is a cold compile, and two more do not fit
    assert _option(calls[-1][2], "--dtype") == ["f32"]


def test_the_compile_step_covers_every_kernel_the_bench_steps_launch():
    """What compile_kernels.py compiles: each bench call's kernels at its dtypes and widths, the
    reduction with the fused kernel, and a cek.torch step's kernels, eager and compiled."""
    compile_kernels = _compile_kernels()
    assert compile_kernels.kernels_of(["--n-dim", "768", "--dtype", "bf16", "--baseline",
                                       "cek-torch"]) == {
        (name, "bf16", 768) for name in ("fused", "reduce", "backward-keep", "forward-rows",
                                         "backward-rows")}
    assert compile_kernels.kernels_of(["--n-dim", "64", "--n-dim", "128", "--kernel",
                                       "forward"]) == {("forward", "f32", 64),
                                                       ("forward", "f32", 128)}
    ids = {k.id for k in compile_kernels.kernels_for(SCRIPT.read_text())}
    for _, _, args in _bench_calls():
        for name, dtype, n_dim in compile_kernels.kernels_of(args):
            kernel = (CosineEmbeddingLossReduce if name == "reduce"
                      else kernel_classes()[name]).for_n_dim(n_dim, dtype)
            assert kernel.id in ids
    assert {"cosine_embedding_loss_fused__bf16__128", "cosine_embedding_loss_reduce__f32__1024",
            "cosine_embedding_loss_backward_keep__f32__4096"} <= ids
    # A split pair brings its first launch; cek.torch at a shape it splits, the split's pairs.
    assert compile_kernels.kernels_of(["--n-dim", "1048576", "--n-rows", "8", "--kernel",
                                       "forward-split", "--baseline", "cek-torch"]) == {
        (name, "f32", 1 << 20) for name in ("forward-split", "split-sums", "fused-split",
                                            "backward-keep-split", "backward-split", "reduce")}
    assert "cosine_embedding_loss_split_sums__bf16__1024" in ids  # the split steps' pairs


def test_the_compile_step_follows_the_split_decision_of_the_model_at_hand(monkeypatch):
    """Whether cek.torch's step at a few wide rows launches the split's pairs is the model's
    call (cek.split_model), which can change: the selection asks it at each step's real shape,
    so it compiles what the steps launch under the model of the day, whichever way it goes."""
    from cek import cosine_embedding_loss_split as split

    compile_kernels = _compile_kernels()
    keep = "cosine_embedding_loss_split_backward_keep__f32__1024"
    asked = set()
    for verdict in (True, False):
        def splits(n_rows, n_dim, dtype, verdict=verdict):
            asked.add((n_rows, n_dim, dtype))
            return verdict or n_dim > split.ONE_BLOCK_MAX_N_DIM

        monkeypatch.setattr(split, "splits", splits)
        ids = {k.id for k in compile_kernels.kernels_for(SCRIPT.read_text())}
        assert (keep in ids) == verdict
        assert ("cosine_embedding_loss_backward_keep__f32__32768" in ids) != verdict
    assert {(48, 1 << 20, "f32"), (128, 32768, "bf16"), (256, 32768, "f32")} <= asked


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


def test_the_users_step_times_the_step_at_their_shapes_without_compiling(monkeypatch):
    """The users step is `cek bench --preset users` (its shapes, both dtypes) with torch's eager
    step and cek.torch's, eager and from a CUDA graph, and no torch.compile: each function,
    dtype and shape would be a cold compile of seconds. Its timeout, taken from the sweeps, is
    the largest of the timed steps after cek_768's and the last one's."""
    from cek.bench import PRESETS

    steps = {name: (limit, args) for name, limit, args in _bench_calls()}
    limit, args = steps["users"]
    assert _option(args, "--preset") == ["users"] and "--dtype" not in args
    assert _baselines(args) == "torch,cek-torch,cek-torch-graph"
    calls = bench_calls(monkeypatch, args)
    assert [(n, d, t) for _, n, d, _, t in calls] == [
        (n, d, t) for t in PRESETS["users"]["dtypes"] for n, d in PRESETS["users"]["shapes"]]
    assert {providers for _, _, _, providers, _ in calls} == {
        ("cek", "torch", "cek-torch", "cek-torch-graph")}
    others = [lim for name, (lim, _) in steps.items() if name not in ("cek_768", "torch_compile")]
    assert limit >= 35 and limit == max(others)
    assert {"base_768", "sweep_fused_bf16", "sweep_rows"}.isdisjoint(steps)  # its budget


def test_a_preset_is_expanded_as_cek_bench_expands_it(monkeypatch):
    """compile_kernels.py reads a `--preset` call as the calls of its shapes, from the table
    cek bench reads (cek.bench.PRESETS): run through cek bench, those calls time what the preset
    call times, row for row, with its own --dtype and --baseline kept."""
    compile_kernels = _compile_kernels()
    for args in (["--preset", "users"],
                 ["--preset", "users", "--dtype", "bf16", "--baseline", "torch,cek-torch"]):
        want = bench_calls(monkeypatch, args)
        got = [c for plain in compile_kernels.plain_calls(args)
               for c in bench_calls(monkeypatch, plain)]
        assert sorted(got, key=str) == sorted(want, key=str) and len(want) >= 6


def test_the_compile_step_covers_the_users_presets_kernels():
    """Every kernel the users step launches (its step through cek.torch at each of the
    preset's widths and dtypes: the fused kernel and its reduction, the keep kernel, and the
    custom ops' rows kernels) is in the compile step's list, before the other kernels."""
    from cek.bench import PRESETS

    compile_kernels = _compile_kernels()
    args = next(args for name, _, args in _bench_calls() if name == "users")
    want = {(name, dtype, n_dim) for _, n_dim in PRESETS["users"]["shapes"]
            for dtype in PRESETS["users"]["dtypes"]
            for name in ("fused", "reduce", "backward-keep", "forward-rows", "backward-rows")}
    assert compile_kernels.kernels_of(args) == want
    ids = {k.id for k in compile_kernels.kernels_for(SCRIPT.read_text())}
    assert {(CosineEmbeddingLossReduce if name == "reduce" else kernel_classes()[name])
            .for_n_dim(n_dim, dtype).id for name, dtype, n_dim in want} <= ids
    assert "cosine_embedding_loss_backward_keep__bf16__2048" in ids  # the users' alone


def test_the_rehearsal_shrinks_a_presets_shapes(monkeypatch, tmp_path):
    """Rehearsed, the users step runs each of the preset's widths small, at a few rows (never
    8192 x 4096 on the emulator), with the preset's kernels, dtypes and the step's baselines;
    each launch is recorded at its real width."""
    from cek import gpu
    from cek.bench import PRESETS
    from cek.cli import main

    rehearse = script_module("rehearse")
    args = next(args for name, _, args in _bench_calls() if name == "users")
    small = rehearse.shrunk(args)
    assert "--preset" not in small and _option(small, "--n-rows") == ["64"]
    widths = [int(d) for d in _option(small, "--n-dim")]
    assert max(widths) < 64
    assert [rehearse._real_of[d] for d in widths] == list(dict.fromkeys(
        d for _, d in PRESETS["users"]["shapes"]))
    assert _option(small, "--dtype") == list(PRESETS["users"]["dtypes"])
    assert _option(small, "--kernel") == list(PRESETS["users"]["kernels"])
    assert _baselines(small) == _baselines(args)
    monkeypatch.setattr(gpu, "device_count", lambda: 0)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    result = CliRunner().invoke(main, ["bench", *small])
    assert result.exit_code == 1 and "no CUDA device" in result.stderr, result.output


def test_every_warm_call_parses(monkeypatch):
    """The warm calls (the compile step's and the warm step's) are `cek bench` calls: each must
    get past its options, or it warms nothing on the GPU machine."""
    from cek import gpu
    from cek.cli import main

    monkeypatch.setattr(gpu, "device_count", lambda: 0)
    for args in _compile_kernels().warm_calls(SCRIPT.read_text()):
        result = CliRunner().invoke(main, ["bench", *args])
        assert result.exit_code == 1 and "no CUDA device" in result.stderr, (args, result.output)


def test_every_kernel_is_compiled_before_the_first_timed_step_and_the_gpu_tier_names_its_tests():
    """The compile step takes every kernel instance (the gpu tier's whatever its widths) on
    every core, the warm step runs each bench call before timing, and the gpu tier runs in
    workers with -v, so a killed run names its last test."""
    steps = {name: args for _, name, _, args in _steps()}
    assert "--all" in steps["compile"] and "--jobs" not in steps["compile"]  # one a core
    assert "--warm" in steps["warm"]
    compile_kernels = _compile_kernels()
    every = {k.id for k in compile_kernels.every_kernel()}
    assert {k.id for k in compile_kernels.selected(SCRIPT.read_text(), True)} == every
    assert {k.id for k in compile_kernels.kernels_for(SCRIPT.read_text())} <= every
    assert {"cosine_embedding_loss_fused__f64__1", "cosine_embedding_loss_reduce__f16__1024",
            "cosine_embedding_loss_backward_rows__bf16__1048576"} <= every
    assert {"-v", "-n"} <= set(steps["gpu_tests"]) and "-q" not in steps["gpu_tests"]
    # the warm calls: few rows, once, no torch.compile (its compiles are its own step's figure)
    for args in compile_kernels.warm_calls(SCRIPT.read_text()):
        assert all(int(rows) <= 256 for rows in _option(args, "--n-rows"))
        assert _option(args, "--repeat") == ["50"] and "--plot" not in args  # cek bench's least
        assert "compile" not in ",".join(_option(args, "--baseline"))


REHEARSE = ROOT / "scripts" / "rehearse.py"


@pytest.mark.emulator
def test_the_rehearsal_fails_a_step_that_launches_a_kernel_not_compiled(tmp_path):
    """rehearse.py on one bench call whose mean launches the reduction, which the compile
    step's record lacks: the step fails, naming it."""
    pytest.importorskip("torch")
    record = tmp_path / "rehearsal"
    record.mkdir()
    fused = kernel_classes()["fused"].for_n_dim(768)
    (record / "compiled.txt").write_text(fused.id + "\n")
    (record / "nvrtc_s").write_text("0.5")
    env = {**os.environ, "OUT": str(tmp_path), "CEK_STEP": "cek_768", "CEK_STEP_LIMIT": "40",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(REHEARSE), "-m", "cek", "bench", "--n-dim", "768",
                           "--n-rows", "65536", "--kernel", "fused", "--repeat", "100",
                           "--baseline", "none"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    log = (tmp_path / "rehearsal.log").read_text()
    reduce_id = CosineEmbeddingLossReduce.for_n_dim(768, "f32").id
    assert log.startswith("cek_768: FAIL launched 1 kernels the compile step did not compile: "
                          f"{reduce_id} "), log
    # the model: start-up, the reduction compiled in the step and the static figures of fused
    assert "2 NVRTC compiles x 0.50s" in log


def test_the_compile_step_compiles_cupys_own_kernels_after_ceks(monkeypatch, capsys):
    """After every cek kernel, the compile step runs each warm call in workers on every core,
    so that CuPy's own kernels the calls reach are in CuPy's disk cache before the warm step,
    which would compile them one after the other, cold, inside its timeout."""
    compile_kernels = _compile_kernels()
    done = []
    monkeypatch.setattr(compile_kernels, "compile_all",
                        lambda kernels, jobs: done.append(("cek", len(kernels), jobs)) or 0)
    monkeypatch.setattr(compile_kernels, "warm_all",
                        lambda calls, jobs: done.append(("cupy", calls, jobs)) or 0)
    assert compile_kernels.main([str(SCRIPT), "--all", "--jobs", "16"]) == 0
    calls = compile_kernels.warm_calls(SCRIPT.read_text())
    assert done == [("cek", len(compile_kernels.every_kernel()), 16), ("cupy", calls, 16)]
    # a call a bench step; the users preset's shapes, a call for each count of rows they are
    # warmed at: 16, 128 and WARM_ROWS (64, and the wider shapes cut to it)
    assert len(calls) == len(_bench_calls()) + 2


def test_a_step_modelled_over_two_thirds_of_its_timeout_fails(tmp_path, monkeypatch):
    """The model leaves out the GPU's own work and a slower or busier CPU there: a third of
    each timeout is kept for them."""
    rehearse = script_module("rehearse")
    monkeypatch.setattr(rehearse, "OUT", tmp_path)
    monkeypatch.setenv("CEK_STEP", "cek_768")
    monkeypatch.setenv("CEK_STEP_LIMIT", "30")
    assert rehearse.verdict([], 19.9, "under")
    assert not rehearse.verdict([], 20.1, "over")
    assert (tmp_path / "rehearsal.log").read_text().splitlines() == [
        "cek_768: OK (modelled 19.9s of 30s: under)",
        "cek_768: FAIL modelled 20.1s on the GPU machine, over two thirds of its 30s "
        "(modelled 20.1s of 30s: over)"]


@pytest.mark.emulator
def test_the_rehearsal_counts_cold_compiles_of_cupy_and_torch(tmp_path):
    """A bench call with CuPy's baseline and torch.compile's, rehearsed with no CuPy kernel
    compiled before: each of CuPy's kernels it reaches and its torch.compile (one function, one
    dtype) are cold compiles in its model, at the seconds planted here as measured."""
    pytest.importorskip("torch")
    record = tmp_path / "rehearsal"
    record.mkdir()
    (record / "compiled.txt").write_text("".join(
        f"{cls.for_n_dim(768).id}\n" for cls in (kernel_classes()["fused"],
                                                  CosineEmbeddingLossReduce)))
    (record / "nvrtc_s").write_text("0.1")
    (record / "cupy_s").write_text("0.5 2.0")
    (record / "torch_compile_s").write_text("30")
    env = {**os.environ, "OUT": str(tmp_path), "CEK_STEP": "torch_compile",
           "CEK_STEP_LIMIT": "35", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(REHEARSE), "-m", "cek", "bench", "--n-dim", "768",
                           "--n-rows", "65536", "--kernel", "fused", "--repeat", "100",
                           "--baseline", "cupy,torch-compile"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    log = (tmp_path / "rehearsal.log").read_text()
    assert done.returncode == 1, done.stdout + done.stderr + log
    found = re.search(r"(\d+) of CuPy's kernels cold \((\d+) x 0.50s, (\d+) reductions x "
                      r"2.00s\), 1 cold torch.compile x 30.0s", log)
    assert found and int(found[1]) > 0, log
    assert log.startswith("torch_compile: FAIL modelled ") and "over two thirds of its 35s" in log


def test_the_rehearsal_models_the_gpu_tier_as_its_workers_run_there(tmp_path):
    """The gpu tier's -n workers each have a core of their own on the GPU machine (16 cores):
    rehearsed, the command runs with one worker, whose start and collection is the tier's start
    there, and not with -n workers queueing for this machine's cores."""
    pytest.importorskip("xdist")
    (tmp_path / "test_count.py").write_text(
        "import os, pathlib\n"
        "def test_count():\n"
        f"    pathlib.Path({str(tmp_path / 'workers')!r}).write_text(\n"
        "        os.environ['PYTEST_XDIST_WORKER_COUNT'])\n")
    (tmp_path / "rehearsal").mkdir()
    (tmp_path / "rehearsal" / "references_s").write_text("20")  # as measured by an earlier step
    env = {**os.environ, "OUT": str(tmp_path), "CEK_STEP": "gpu_tests", "CEK_STEP_LIMIT": "58",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(REHEARSE), "-m", "pytest", "-v", "-n", "8",
                           "--dist", "loadfile", "-p", "no:cacheprovider",
                           str(tmp_path / "test_count.py")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert any("PASSED" in line and line.rstrip().endswith("test_count.py::test_count")  # -v
               for line in done.stdout.splitlines()), done.stdout
    assert (tmp_path / "workers").read_text() == "1"
    log = (tmp_path / "rehearsal.log").read_text()
    assert log.startswith("gpu_tests: OK (modelled ") and "8 workers on 16 cores" in log, log


@pytest.mark.emulator
@pytest.mark.skipif(os.environ.get("CEK_REHEARSAL") != "1",
                    reason="the whole rehearsal takes minutes: .ci/rehearse runs it, in a venv "
                           "of the GPU machine's versions (CEK_REHEARSAL=1)")
def test_the_rehearsal_runs_every_step_and_each_fits(tmp_path):
    """`device_check.sh --rehearse`: every step, in order, exit 0, each modelled time within its
    timeout, every launched kernel compiled first; the summary and the files as on the GPU."""
    out = tmp_path / "out"
    start = time.monotonic()
    done = subprocess.run(["bash", str(SCRIPT), "--rehearse"], env={
        **os.environ, "OUT": str(out), "CEK_PYTHON": sys.executable}, capture_output=True,
        text=True, timeout=600)
    seconds = time.monotonic() - start
    steps = [line.split(": ", 1) for line in (out / "steps.log").read_text().splitlines()]
    assert [name for name, _ in steps] == [name for _, name, _, _ in _steps()], done.stderr
    assert all(re.fullmatch(r"exit 0 after \d+s", outcome) for _, outcome in steps), steps
    rehearsal = (out / "rehearsal.log").read_text()
    assert "FAIL" not in rehearsal and done.returncode == 0, rehearsal + done.stderr
    assert {line.split(":")[0] for line in rehearsal.splitlines()} == \
        {name for _, name, _, _ in _steps()}
    assert json.loads((out / "bench.json").read_text())
    doctor_txt = (out / "doctor.txt").read_text()
    assert "verdict" in doctor_txt and "Traceback" not in doctor_txt
    print(f"the rehearsal took {seconds:.0f}s")


@pytest.mark.emulator
@pytest.mark.skipif(os.environ.get("CEK_REHEARSAL") != "1",
                    reason="the rehearsal's first steps take minutes: .ci/rehearse runs it, in a "
                           "venv of the GPU machine's versions (CEK_REHEARSAL=1)")
def test_the_rehearsal_stopped_by_a_term_keeps_its_finished_steps(tmp_path):
    """`device_check.sh --rehearse` stopped by a TERM once its first bench step has ended, as
    the GPU machine stops a command at its time limit: it ends at once, steps.log names the
    step it stopped, and bench.json parses and holds the rows of the step that ended."""
    import signal

    out = tmp_path / "out"
    names = [name for _, name, _, _ in _steps()]
    first = _bench_calls()[0][0]
    after = names[names.index(first) + 1]
    run = subprocess.Popen(["bash", str(SCRIPT), "--rehearse"], env={
        **os.environ, "OUT": str(out), "CEK_PYTHON": sys.executable},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 540
        tables = out / "tables.txt"  # a bench step's heading goes there as it starts
        while run.poll() is None and time.monotonic() < deadline and not (
                tables.exists() and f"== {after}\n" in tables.read_text()):
            time.sleep(0.5)
        time.sleep(2)  # well inside the step, which runs for seconds
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    outcome = dict(line.split(": ", 1) for line in (out / "steps.log").read_text().splitlines())
    assert run.returncode == 143, stderr
    assert list(outcome) == names[:names.index(after) + 1], outcome
    assert outcome[first].startswith("exit 0 after "), outcome
    assert outcome[after].startswith("cut by TERM after "), outcome
    rows = json.loads((out / "bench.json").read_text())
    assert {row["run"] for row in rows} <= {first, after}
    assert [row for row in rows if row["run"] == first], rows


def test_ci_runs_the_rehearsal_on_the_background_core_and_fails_with_it():
    """.ci/run: .ci/rehearse after the NVRTC matrix, in the background job whose status CI
    waits on, its log printed after the main suite's."""
    run = (ROOT / ".ci" / "run").read_text()
    job = re.search(r"^\($(.*?)^\) &\nnvrtc=\$!$", run, re.M | re.S)
    assert job, run
    lines = [line.strip() for line in job[1].splitlines()]
    assert '.ci/rehearse > "$logs/rehearse.log" 2>&1 || status=1' in lines
    assert lines.index('.ci/rehearse > "$logs/rehearse.log" 2>&1 || status=1') > \
        next(i for i, line in enumerate(lines) if line.startswith(".ci/matrix .ci/nvrtc"))
    assert 'exit "$status"' in lines
    assert 'wait "$nvrtc" || status=1' in run and 'cat "$logs/rehearse.log"' in run
    rehearse = (ROOT / ".ci" / "rehearse").read_text()
    assert "CEK_REHEARSAL=1 exec .ci/matrix .ci/image.txt" in rehearse


# -- the whole script on the stand-in ------------------------------------------------------------

HANG_LIMIT_S = 10  # the hanging step's timeout in the test: time enough to time cek's row first
SLOW_S = 1.0


@pytest.mark.emulator
def test_a_run_with_a_slow_and_a_hanging_provider_keeps_its_figures(tmp_path):
    """device_check.sh end to end: CuPy is the stand-in (tests/fake_cupy.py) with the emulator
    as the GPU, every width is 8 and every row count 64 (the kernels' emulator builds are shared
    with tests/test_bench.py), torch.compile is left out (it would compile C++ for minutes), and
    the gpu tier is not run, and the compile step lists its kernels without compiling them.
    Planted: the CuPy baseline takes SLOW_S more in its first call, and torch.compile's provider
    hangs until its step's timeout kills it, in each torch.compile step."""
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    compiled = [name for name, _, args in _bench_calls() if "compile" in _baselines(args)]
    env = {**os.environ, "OUT": str(out), "CEK_PYTHON": str(python),
           "CEK_PLANT": f"cupy={SLOW_S},torch-compile=hang",
           **{f"LIMIT_{name}": str(HANG_LIMIT_S) for name in compiled},
           # the emulator runs the split's 1024-thread blocks far slower than a GPU
           **{f"LIMIT_{name}": "120" for name, _, _ in _bench_calls() if name.startswith("split_")}}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # the killed step

    outcome = dict(line.split(": ", 1) for line in (out / "steps.log").read_text().splitlines())
    names = [name for _, name, _, _ in _steps()]
    assert list(outcome) == names
    for name in compiled:
        assert outcome.pop(name).startswith(f"killed by its {HANG_LIMIT_S}s timeout")
    assert all(v.startswith("exit 0 ") for v in outcome.values()), outcome

    rows = json.loads((out / "bench.json").read_text())
    bench_names = [name for name, _, _ in _bench_calls()]
    assert list(dict.fromkeys(r["run"] for r in rows)) == bench_names  # in the order they ran
    # Each hanging step kept the rows it timed before the hang: cek's, alone and as a mean.
    for name in compiled:
        assert [(r["kernel"], r["provider"], r["reduction"]) for r in rows if r["run"] == name] \
            == [("fused", "cek", "none"), ("fused", "cek", "mean")]
    # cek's steps: the kernels, the mean, the training step through cek.torch and torch's
    # (cek-torch-graph needs CUDA tensors: not on the stand-in).
    assert {(r["provider"], r["reduction"]) for r in rows
            if r["run"] == "cek_768" and r["kernel"] == "fused"} == {
        ("cek", "none"), ("cek", "mean"), ("cek-torch", "mean"), ("torch", "mean")}
    assert {(r["kernel"], r["dtype"]) for r in rows if r["run"] == "cek_768"} == {
        (k, t) for k in ("fused", "forward", "backward", "backward-keep")
        for t in ("f32", "bf16")}
    # the users' shapes: the preset's call, shrunk, torch's eager step and cek.torch's
    assert {(r["provider"], r["reduction"], r["dtype"]) for r in rows if r["run"] == "users"} == {
        (p, m, t) for p, m in (("cek", "none"), ("cek", "mean"), ("torch", "mean"),
                               ("cek-torch", "mean")) for t in ("f32", "bf16")}
    # the keep kernel: the step's backward, its kept rows and its recomputed ones, cek alone
    assert {(r["provider"], r["reduction"]) for r in rows
            if r["run"] == "cek_768" and r["kernel"] == "backward-keep"} == {
        ("cek", "kept"), ("cek", "recompute")}
    slow = [r["first_call_s"] for r in rows if r["provider"] == "cupy"]
    assert slow and min(slow) >= SLOW_S
    # The static figures come after a kernel's timings: the killed step never got its own.
    assert all(r["static"] == (None if r["run"] in compiled else {"id": r["kernel"]})
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
    listed = (out / "compile.log").read_text().split()
    assert {"cosine_embedding_loss_reduce__bf16__1024",
            "cosine_embedding_loss_backward_keep__bf16__1024"} <= set(listed)
    # The NVRTC cek compiles the static figures with, in env.txt (no CuPy here: none of its);
    # in every row, CuPy's (the stand-in's) and cek's.
    assert '"nvrtc_cek": ' in env_txt
    assert all({"cupy", "cuda_driver", "nvrtc", "nvrtc_cek", "cek"} <= set(r["versions"])
               and r["gpu"] for r in rows)


def _shrunk(args: list[str]) -> list[str]:
    """`cek bench` arguments at one small width: every --n-dim 8, --n-rows 64 (2 where a split
    kernel runs: 1024-thread blocks, slow to emulate), --repeat 50; a preset's call, its shapes
    so too."""
    shapes, args = _compile_kernels().preset_args(args)
    if shapes:
        args = [*args, "--n-dim", "8", "--n-rows", "64"]
    rows = "2" if any(a.endswith("-split") for a in args) else "64"
    small = {"--n-dim": "8", "--n-rows": rows, "--repeat": "50"}
    return [small[args[i - 1]] if i and args[i - 1] in small else a for i, a in enumerate(args)]


def _planted(providers_for, plants: dict):
    """providers_for whose planted providers sleep first: so many seconds, or for ever."""

    def planted(*args, **kwargs):
        out = providers_for(*args, **kwargs)  # by (provider, reduction)
        for key, build in out.items():
            if key[0] in plants:
                delay = plants[key[0]]
                out[key] = lambda build=build, delay=delay: (time.sleep(delay), build())[1]
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
    elif argv[:1] == ["scripts/compile_kernels.py"] and "--warm" in argv:
        # the calls it would warm, each parsed by the bench test above; rehearse.py runs them
        print("\n".join(" ".join(args) for args in _compile_kernels().warm_calls(
            Path(argv[1]).read_text())))
    elif argv[:1] == ["scripts/compile_kernels.py"]:  # what it would compile, on the stand-in
        sys.argv = [*argv, "--list"]
        exec(compile(Path(argv[0]).read_text(), argv[0], "exec"), {"__name__": "__main__"})
    elif argv[:2] == ["-m", "pytest"]:
        print("the gpu tier is not run on the stand-in")
    elif argv[:3] == ["-m", "cek", "doctor"]:  # no GPU here: doctor says so, exit 1
        print("cek doctor is not run on the stand-in")
    elif argv[:1] == ["-c"]:  # the script's probe for matplotlib
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    elif argv[:1] == ["-"]:  # the script's inline Python
        sys.argv = argv
        exec(compile(sys.stdin.read(), "<stdin>", "exec"), {"__name__": "__main__"})
    else:
        sys.exit(f"not a command of device_check.sh: {argv}")
