"""cpu tier: scripts/device_check.sh, the one run on a lent GPU, is checked here before it gets
there: every `cek bench` call in it parses, its step timeouts fit its 8-minute budget, its steps
come in the order a first run needs (every kernel compiled, then cek and the training step at
the target shapes, the gpu tier without its CLI bench test, the baselines, torch.compile last);
and (emulator tier) the whole script runs on the stand-in for CuPy with a slow and a hanging
provider planted, and still comes back with its figures.

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

from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
from cek.kernel import kernel_classes

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device_check.sh"
BUDGET_S = 480
KILL_AFTER_S = 5  # the script's grace after a step's TERM


def _compile_kernels():
    """scripts/compile_kernels.py as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compile_kernels",
                                                  ROOT / "scripts" / "compile_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        'timeout -k "$KILL_AFTER_S" "$limit" "$@"']
    assert [name for kind, name, _, _ in _steps() if kind == "step"] == [
        "doctor", "preflight", "compile", "gpu_tests"]
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


def _option(args: list[str], option: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]


def test_the_steps_come_in_the_order_a_first_run_needs():
    names = [name for _, name, _, _ in _steps()]
    assert names[:3] == ["doctor", "preflight", "compile"]
    calls = _bench_calls()
    # cek at the target shapes first, in float32 and bfloat16: the fused kernel (timed alone and
    # as a mean) and the training step through cek.torch, eager and from a CUDA graph, beside
    # torch's eager step; no torch.compile.
    first = [(name, args) for name, _, args in calls if name.startswith("cek_")]
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
    assert _option(calls[-1][2], "--dtype") == ["f32", "bf16"]


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
    assert {"cosine_embedding_loss_split_sums__bf16__1024",
            "cosine_embedding_loss_split_backward_keep__f32__1024"} <= ids


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
    kernel runs: 1024-thread blocks, slow to emulate), --repeat 50."""
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
    elif argv[:1] == ["scripts/compile_kernels.py"]:  # what it would compile, on the stand-in
        sys.argv = [*argv, "--list"]
        exec(compile(Path(argv[0]).read_text(), argv[0], "exec"), {"__name__": "__main__"})
    elif argv[:2] == ["-m", "pytest"]:
        print("the gpu tier is not run on the stand-in")
    elif argv[:3] == ["-m", "cek", "doctor"]:  # no GPU here: doctor says so, exit 1
        print("cek doctor is not run on the stand-in")
    elif argv[:1] == ["-"]:  # the script's inline Python
        sys.argv = argv
        exec(compile(sys.stdin.read(), "<stdin>", "exec"), {"__name__": "__main__"})
    else:
        sys.exit(f"not a command of device_check.sh: {argv}")
