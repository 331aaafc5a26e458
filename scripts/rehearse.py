"""`bash scripts/device_check.sh --rehearse`: each Python command of that script, run on a
machine without a GPU, so that a broken command, a missing import or a version mismatch shows up
before the GPU run. The script runs its Python as `$PY ARGS`; rehearsing, $PY is
`python scripts/rehearse.py`, which takes the same ARGS:

  -m cek doctor          the real doctor; here (no GPU) it must end in its report, exit 0 or 1
  -c CODE, - (stdin)     as they are (the matplotlib probe, the preflight, the summary)
  scripts/compile_kernels.py SCRIPT ...   its own argument parsing and selection; each kernel it
                         would compile is recorded, not compiled, and cek's NVRTC is timed here on
                         SAMPLE of them; with --warm, its bench calls on the stand-in, as below
  -m cek bench ARGS      on the CuPy stand-in (tests/fake_cupy.py) with the emulator, each width
                         made small (a distinct one per width) and the rows few; every kernel it
                         launches is checked, at the step's real width, against the recorded ones
  -m pytest ARGS         with one xdist worker for its -n (gpu_tier: why), else as it is; the
                         gpu tier collects every test file, then skips (no GPU)

What a step does not do here: torch.compile compiles nothing (the identity stands in: its C++
builds take minutes on this CPU), and the static figures are counted, not computed.

Each step's verdict is a line of $OUT/rehearsal.log: FAIL when it launched a kernel that the
compile step did not record, or when its modelled time on the GPU machine is over its timeout
(CEK_STEP_LIMIT). The model counts what the GPU machine pays on its CPU: this process's start-up
as measured here (its imports, torch's among them), and every NVRTC compile it would make (a
kernel not compiled before, the static figures of each kernel timed) at the seconds one took
here; the compile step's NVRTC is shared among GPU_CORES workers. The GPU's own work (milliseconds
a row) and CuPy's own kernels (none on the stand-in; the warm step compiles them there) are not
in it.
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()

import math  # noqa: E402 - after the clock: the start-up measured is the imports'
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPU_CORES = 16  # the GPU machine's CPU cores, which the compile step's workers share
SAMPLE = 4  # kernels compiled here to time NVRTC
SMALL_DIM, SPLIT_ROWS, ROWS = 8, "2", "64"  # the split's 1024-thread blocks are slow to emulate
OUT = Path(os.environ.get("OUT", "out"))
RECORD = OUT / "rehearsal"  # compiled.txt, nvrtc_s: what the compile step leaves the others


def verdict(failures: list[str], modelled: float, how: str) -> bool:
    """The step's line in rehearsal.log; whether it passed."""
    step = os.environ.get("CEK_STEP", "?")
    limit = float(os.environ.get("CEK_STEP_LIMIT", "inf"))
    if modelled > limit:
        failures = [*failures, f"modelled {modelled:.1f}s on the GPU machine, over its {limit:g}s"]
    line = (f"{step}: {'FAIL ' + '; '.join(failures) if failures else 'OK'} "
            f"(modelled {modelled:.1f}s of {limit:g}s: {how})")
    with open(OUT / "rehearsal.log", "a") as log:
        log.write(line + "\n")
    print(f"rehearsal: {line}", file=sys.stderr)
    return not failures


def nvrtc_seconds(kernels: list | None = None) -> float:
    """The seconds of one NVRTC compile here: as measured before, else measured now on SAMPLE
    of `kernels` (default: the fused kernel), after one compile that starts NVRTC."""
    if kernels is None and (RECORD / "nvrtc_s").exists():
        return float((RECORD / "nvrtc_s").read_text())
    from cek.compile import compile_kernel
    from cek.kernel import kernel_classes

    kernels = kernels or [kernel_classes()["fused"].for_n_dim(768)]
    compile_kernel(kernels[0], "sm_90")
    start = time.perf_counter()
    sample = kernels[::max(1, len(kernels) // SAMPLE)][:SAMPLE]
    for kernel in sample:
        compile_kernel(kernel, "sm_90")
    seconds = (time.perf_counter() - start) / len(sample)
    RECORD.mkdir(parents=True, exist_ok=True)
    (RECORD / "nvrtc_s").write_text(f"{seconds:.4f}")
    return seconds


# -- the stand-in GPU ----------------------------------------------------------------------------

_small_of: dict[int, int] = {}  # a real width -> its small one, distinct for each
_real_of: dict[int, int] = {}
_launched: set[str] = set()  # ids of the kernels launched, at their real widths
_static: set[str] = set()  # ids of the kernels whose static figures a step computes


def shrunk(args: list[str]) -> list[str]:
    """`cek bench` arguments made small: each --n-dim its own small width, --n-rows 64 (2 where a
    split kernel runs), --repeat 50."""
    rows = SPLIT_ROWS if any(a.endswith("-split") for a in args) else ROWS
    out = list(args)
    for i in range(1, len(out)):
        option = out[i - 1]
        if option == "--n-dim":
            real = int(out[i])
            small = _small_of.setdefault(real, SMALL_DIM + len(_small_of))
            _real_of[small] = real
            out[i] = str(small)
        elif option == "--n-rows":
            out[i] = rows
        elif option == "--repeat":
            out[i] = "50"
    return out


def plant_standin():
    """The stand-in in place of CuPy, each launch recorded at its real width."""
    sys.path.insert(0, str(ROOT / "tests"))
    import fake_cupy
    import pytest
    import torch

    from cek import bench, gpu

    patch = pytest.MonkeyPatch()
    standin = fake_cupy.install(patch)
    patch.setattr(bench, "FLUSH_BYTES", 4)
    patch.setattr(bench, "CHECK_ROWS", 6)
    patch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    width = {"now": None}
    run_bench = bench.run_bench

    def at_width(kernel_names, n_rows, n_dim, *args, **kwargs):
        width["now"] = n_dim
        return run_bench(kernel_names, n_rows, n_dim, *args, **kwargs)

    def recording(kernel, options=()):
        real = _real_of.get(width["now"])
        _launched.add(type(kernel).for_n_dim(real, kernel.dtype).id if real else kernel.id)
        return standin.get_function(kernel, options)

    def static_row(kernel, n_rows, n_dim, *, arch, gpu):
        _static.add(type(kernel).for_n_dim(_real_of.get(n_dim, n_dim), kernel.dtype).id)
        return {"id": next(k for k, c in bench.kernel_classes().items() if c.name == kernel.name)}

    report = type(sys)("cek.report")
    report.static_row = static_row
    patch.setitem(sys.modules, "cek.report", report)
    patch.setattr(bench, "run_bench", at_width)
    patch.setattr(gpu, "get_function", recording)


def check_launches(code: int, ready: float, static: bool = True) -> int:
    """The step's exit status after its launches and modelled time are checked."""
    try:
        compiled = set((RECORD / "compiled.txt").read_text().split())
    except OSError:
        compiled = set()
    missing = sorted(_launched - compiled)
    failures = [f"launched {len(missing)} kernels the compile step did not compile: "
                f"{', '.join(missing)}"] if missing else []
    seconds = nvrtc_seconds()
    compiles = len(missing) + (len(_static) if static else 0)
    ok = verdict(failures, ready + compiles * seconds,
                 f"start-up {ready:.1f}s here, {compiles} NVRTC compiles x {seconds:.2f}s")
    return code or (0 if ok else 1)


def _exit_code(run) -> int:
    try:
        run()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


# -- the commands --------------------------------------------------------------------------------


def bench(args: list[str]) -> int:
    import torch  # noqa: F401 - its import is start-up the GPU machine pays too

    from cek.cli import main

    plant_standin()
    ready = time.perf_counter() - STARTED
    code = _exit_code(lambda: main(["bench", *shrunk(args)], prog_name="cek"))
    return check_launches(code, ready)


def compile_step(argv: list[str]) -> int:
    import importlib.util

    spec = importlib.util.spec_from_file_location("compile_kernels", ROOT / argv[0])
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    if "--warm" in argv:  # each bench call once, on the stand-in, small
        from cek.cli import main  # noqa: F401 - start-up, as in the step

        plant_standin()
        calls = kernels.warm_calls
        kernels.warm_calls = lambda script: [shrunk(args) for args in calls(script)]
        ready = time.perf_counter() - STARTED
        return check_launches(_exit_code(lambda: sys.exit(kernels.main(argv[1:]))), ready,
                              static=False)
    kernels.compile_all = record_compiles
    return _exit_code(lambda: sys.exit(kernels.main(argv[1:])))


def record_compiles(kernels: list, jobs: int) -> int:
    """The compile step, rehearsed: each kernel recorded, NVRTC timed on SAMPLE of them here,
    the step modelled as its workers' start-up and its compiles shared among GPU_CORES."""
    RECORD.mkdir(parents=True, exist_ok=True)
    (RECORD / "compiled.txt").write_text("".join(f"{k.id}\n" for k in kernels))
    for kernel in kernels:
        print(f"{kernel.id}: recorded", flush=True)
    seconds = nvrtc_seconds(kernels)
    start = time.perf_counter()  # a worker's start: a Python that imports CuPy and cek.gpu
    subprocess.run([sys.executable, "-c", "import cupy, cek.gpu"], check=False,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    worker = time.perf_counter() - start
    # There, --jobs is one worker a core: GPU_CORES.
    rounds = math.ceil(len(kernels) / GPU_CORES)
    verdict([], worker + rounds * seconds,
            f"{len(kernels)} kernels in {rounds} rounds of {GPU_CORES} workers x "
            f"{seconds:.2f}s NVRTC each, a worker's start-up {worker:.1f}s here")
    return 0


def doctor() -> int:
    """The real doctor: its report must end (exit 0 or 1) with no traceback."""
    done = subprocess.run([sys.executable, "-m", "cek", "doctor"], capture_output=True,
                          text=True, check=False)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    failures = []
    if done.returncode not in (0, 1):
        failures.append(f"cek doctor exited {done.returncode}")
    if "Traceback" in done.stdout + done.stderr:
        failures.append("cek doctor ended in a traceback")
    if "verdict" not in done.stdout:
        failures.append("cek doctor gave no verdict")
    # No GPU here: no launch, so its compiles (two kernels, forward and backward, two dtypes)
    # are counted in.
    own = time.perf_counter() - STARTED
    seconds = nvrtc_seconds()
    return 0 if verdict(failures, own + 6 * seconds,
                        f"{own:.1f}s here, 6 NVRTC compiles x {seconds:.2f}s") else 1


def gpu_tier(argv: list[str]) -> int:
    """The gpu tier's command with one xdist worker in place of its -n: the same plugin, file
    distribution, -v and deselection, and the model is its time here. There, each of the -n
    workers starts, imports and collects every test file on a core of its own (GPU_CORES is more
    than -n), so the tier's start is one worker's, which one worker here measures; -n workers on
    this machine's 2 cores would time their collections queueing for a core, a figure of this
    machine. The tests skip here (no GPU): their GPU time is not in the model, nor NVRTC, since
    the compile step compiled every kernel instance before them."""
    at = argv.index("-n")
    workers, argv = argv[at + 1], [*argv[:at + 1], "1", *argv[at + 2:]]
    code = subprocess.run([sys.executable, *argv], check=False).returncode
    own = time.perf_counter() - STARTED
    ok = verdict([], own, f"one worker's start, collection and skips {own:.1f}s here; there "
                          f"{workers} workers on {GPU_CORES} cores, each a core of its own")
    return code or (0 if ok else 1)


def as_it_is(argv: list[str]) -> int:
    """A command run unchanged; inside a step, its time here is the model."""
    code = subprocess.run([sys.executable, *argv], check=False).returncode
    if not os.environ.get("CEK_STEP"):
        return code
    own = time.perf_counter() - STARTED
    return code or (0 if verdict([], own, f"{own:.1f}s here") else 1)


def main(argv: list[str]) -> int:
    if argv[:3] == ["-m", "cek", "bench"]:
        return bench(argv[3:])
    if argv[:3] == ["-m", "cek", "doctor"]:
        return doctor()
    if argv[:1] == ["scripts/compile_kernels.py"]:
        return compile_step(argv)
    if argv[:2] == ["-m", "pytest"] and "-n" in argv and os.environ.get("CEK_STEP"):
        return gpu_tier(argv)
    if argv[:2] == ["-m", "pytest"] or argv[:1] in (["-"], ["-c"]):
        return as_it_is(argv)
    print(f"rehearse.py: not a command of device_check.sh: {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
