"""`bash scripts/device_check.sh --rehearse`: each Python command of that script, run on a
machine without a GPU, so that a broken command, a missing import or a version mismatch shows up
before the GPU run. The script runs its Python as `$PY ARGS`; rehearsing, $PY is
`python scripts/rehearse.py`, which takes the same ARGS:

  -m cek doctor          the real doctor; here (no GPU) it must end in its report, no traceback
  -c CODE, - (stdin)     as they are (the matplotlib probe, the preflight, the summary)
  scripts/compile_kernels.py SCRIPT ...   its own argument parsing and selection; each kernel it
                         would compile is recorded, not compiled, and cek's NVRTC is timed here on
                         a few of them; then its bench calls on the stand-in, as below, each of
                         CuPy's own kernels they reach recorded; with --warm, those calls only
  -m cek bench ARGS      on the CuPy stand-in (tests/fake_cupy.py) with the emulator, each width
                         made small (a distinct one per width) and the rows few; every kernel it
                         launches is checked, at the step's real width, against the recorded ones
  -m pytest ARGS         with one xdist worker for its -n (gpu_tier: why), else as it is; the
                         gpu tier collects every test file, then skips (no GPU)

What a step does not do here: torch.compile compiles nothing (the identity stands in: its C++
builds take minutes on this CPU), and the static figures are counted, not computed.

Each step's verdict is a line of $OUT/rehearsal.log: FAIL when it launched a kernel that the
compile step did not record, or when its modelled time on the GPU machine is over two thirds of
its timeout (CEK_STEP_LIMIT; SHARE: the rest is the margin for what the model leaves out). The
model counts what the GPU machine pays on its CPU, in CPU seconds used here (cpu_seconds: a
busy machine's wall clock also counts the wait for a core): this process's start-up (its
imports, torch's among them), and every cold compile it would make, each at the seconds one took
here (scripts/rehearse_costs.py measures them):
- cek's kernels (NVRTC): a kernel not compiled before, the static figures of each kernel timed;
  the compile step's are shared among GPU_CORES workers;
- CuPy's own kernels (CuPy's NVRTC and headers: one elementwise kernel, one CUB reduction): each
  distinct one the step reaches (on the stand-in, a NumPy ufunc, cast, where, fill or copy on a
  device array, of its dtypes) that the compile step's bench calls did not; the compile step's
  calls run in GPU_CORES workers, each round as long as its call that reaches the most;
- torch.compile: each compiled function at new dtypes, as one cold compile of a training step
  here (inductor building C++ for this CPU; there it builds Triton kernels); in the gpu tier,
  each gpu test that calls torch.compile, beside the float64 references of
  tests/test_cosine_embedding_loss.py, measured here, on workers of their own.
The GPU's own work (milliseconds a row) is not in it.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also where imported by its path
from compile_kernels import preset_args  # noqa: E402
from rehearse_costs import (cpu_seconds, cupy_seconds, gpu_tier_references,  # noqa: E402
                            nvrtc_seconds, torch_compile_seconds, worker_start)

ROOT = Path(__file__).resolve().parents[1]
GPU_CORES = 16  # the GPU machine's CPU cores, which the compile step's workers share
SMALL_DIM, SPLIT_ROWS, ROWS = 8, "2", "64"  # the split's 1024-thread blocks are slow to emulate
# The share of its timeout a step's modelled time may take: the rest is for what the model
# leaves out (the GPU's own work, a slower or busier CPU there).
SHARE = 2 / 3
OUT = Path(os.environ.get("OUT", "out"))
RECORD = OUT / "rehearsal"  # compiled.txt, nvrtc_s: what the compile step leaves the others


def verdict(failures: list[str], modelled: float, how: str) -> bool:
    """The step's line in rehearsal.log; whether it passed: FAIL where its modelled time is over
    SHARE of its timeout."""
    step = os.environ.get("CEK_STEP", "?")
    limit = float(os.environ.get("CEK_STEP_LIMIT", "inf"))
    if modelled > SHARE * limit:
        failures = [*failures, f"modelled {modelled:.1f}s on the GPU machine, over two thirds "
                               f"of its {limit:g}s"]
    line = (f"{step}: {'FAIL ' + '; '.join(failures) if failures else 'OK'} "
            f"(modelled {modelled:.1f}s of {limit:g}s: {how})")
    with open(OUT / "rehearsal.log", "a") as log:
        log.write(line + "\n")
    print(f"rehearsal: {line}", file=sys.stderr)
    return not failures


# -- the stand-in GPU ----------------------------------------------------------------------------

_small_of: dict[int, int] = {}  # a real width -> its small one, distinct for each
_real_of: dict[int, int] = {}
_launched: set[str] = set()  # ids of the kernels launched, at their real widths
_static: set[str] = set()  # ids of the kernels whose static figures a step computes
_cupy: set[str] = set()  # CuPy's own kernels a step reaches ("operation dtypes...")
_compiled: set[tuple] = set()  # (function, its tensors' dtypes): each a torch.compile of its own
_launching = [0]  # inside a stand-in launch: the emulator's NumPy is no CuPy kernel


def shrunk(args: list[str]) -> list[str]:
    """`cek bench` arguments made small: each --n-dim its own small width, --n-rows 64 (2 where a
    split kernel runs), --repeat 50. A preset's call (`--preset NAME`) becomes a call of each of
    its widths, as compile_kernels.py expands it, at those rows: its widest shapes are never
    emulated."""
    shapes, args = preset_args(args)
    if shapes:
        widths = dict.fromkeys(n_dim for _, n_dim in shapes)
        args = [*(a for n_dim in widths for a in ("--n-dim", str(n_dim))), "--n-rows", ROWS,
                *args]
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
    patch.setattr(torch, "compile", counted_compile)
    record_cupy(patch, fake_cupy, standin)
    width = {"now": None}
    run_bench = bench.run_bench

    def at_width(kernel_names, n_rows, n_dim, *args, **kwargs):
        width["now"] = n_dim
        return run_bench(kernel_names, n_rows, n_dim, *args, **kwargs)

    def recording(kernel, options=()):
        real = _real_of.get(width["now"])
        _launched.add(type(kernel).for_n_dim(real, kernel.dtype).id if real else kernel.id)
        launch = standin.get_function(kernel, options)

        def launching(*args, **kwargs):
            _launching[0] += 1
            try:
                return launch(*args, **kwargs)
            finally:
                _launching[0] -= 1

        return launching

    def static_row(kernel, n_rows, n_dim, *, arch, gpu):
        _static.add(type(kernel).for_n_dim(_real_of.get(n_dim, n_dim), kernel.dtype).id)
        return {"id": next(k for k, c in bench.kernel_classes().items() if c.name == kernel.name)}

    report = type(sys)("cek.report")
    report.static_row = static_row
    patch.setitem(sys.modules, "cek.report", report)
    patch.setattr(bench, "run_bench", at_width)
    patch.setattr(gpu, "get_function", recording)


def counted_compile(fn, **kwargs):
    """torch.compile in the rehearsal: `fn` itself (inductor's C++ builds take minutes on this
    CPU), each first call at new dtypes counted as one cold compile of its own."""
    import torch

    def first_calls_counted(*args, **kw):
        _compiled.add((id(fn), tuple(str(a.dtype) for a in args if isinstance(a, torch.Tensor))))
        return fn(*args, **kw)

    return first_calls_counted


def record_cupy(patch, fake_cupy, standin):
    """Each of CuPy's own kernels a step reaches, seen in what the stand-in does in CuPy's place
    (outside cek's launches): a NumPy ufunc on a device array (CuPy's elementwise kernel or
    reduction of those dtypes), a cast, a where, a fill, a copy."""
    import numpy as np

    array = fake_cupy.DeviceArray

    def kind(value) -> str:  # an array's or a NumPy scalar's dtype, a dtype's, else the type
        if isinstance(value, (np.ndarray, np.generic)):
            return str(value.dtype)
        if isinstance(value, (type, np.dtype)):
            return np.dtype(value).name
        return type(value).__name__

    def note(operation, *values):
        if not _launching[0]:
            _cupy.add(" ".join([operation, *map(kind, values)]))

    def array_ufunc(self, ufunc, method, *inputs, out=None, **kwargs):
        note(f"{ufunc.__name__}.{method}", *inputs)
        plain = [a.view(np.ndarray) if isinstance(a, array) else a for a in inputs]
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, array) else o for o in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return result.view(array) if type(result) is np.ndarray else result

    astype = array.astype

    def cast(self, dtype, *args, **kwargs):
        if np.dtype(dtype) != self.dtype:
            note("astype", self, dtype)
        return astype(self, dtype, *args, **kwargs)

    patch.setattr(array, "__array_ufunc__", array_ufunc, raising=False)
    patch.setattr(array, "astype", cast)
    cupy = standin.cupy
    for name in ("where", "full", "zeros", "ones", "copyto", "ascontiguousarray"):
        def noted(*args, _name=name, _run=getattr(cupy, name), **kwargs):
            if _name != "ascontiguousarray" or not args[0].flags.c_contiguous:
                note(_name, *[a for a in args if hasattr(a, "dtype")],
                     *([kwargs["dtype"]] if kwargs.get("dtype") is not None else []))
            return _run(*args, **kwargs)

        patch.setattr(cupy, name, noted)


def _recorded(name: str) -> set[str]:
    try:
        return set((RECORD / name).read_text().splitlines())
    except OSError:
        return set()


def cold_compiles() -> tuple[float, str]:
    """(seconds, how): the step's cold compiles of CuPy's kernels (those the compile step's
    bench calls did not reach) and of torch.compile, as modelled."""
    elementwise, reduction = cupy_seconds(RECORD)
    cold = _cupy - _recorded("cupy_compiled.txt")
    reductions = sum(".reduce" in kernel for kernel in cold)
    seconds = (len(cold) - reductions) * elementwise + reductions * reduction
    how = (f"{len(cold)} of CuPy's kernels cold ({len(cold) - reductions} x {elementwise:.2f}s, "
           f"{reductions} reductions x {reduction:.2f}s)")
    if _compiled:
        compile_s = torch_compile_seconds(RECORD)
        seconds += len(_compiled) * compile_s
        how += f", {len(_compiled)} cold torch.compile x {compile_s:.1f}s"
    return seconds, how


def check_launches(code: int, ready: float, static: bool = True) -> int:
    """The step's exit status after its launches and modelled time are checked."""
    compiled = _recorded("compiled.txt")
    missing = sorted(_launched - compiled)
    failures = [f"launched {len(missing)} kernels the compile step did not compile: "
                f"{', '.join(missing)}"] if missing else []
    seconds = nvrtc_seconds(RECORD)
    compiles = len(missing) + (len(_static) if static else 0)
    cold, how = cold_compiles()
    ok = verdict(failures, ready + compiles * seconds + cold,
                 f"start-up {ready:.1f}s here, {compiles} NVRTC compiles x {seconds:.2f}s, {how}")
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
    ready = cpu_seconds()
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
        ready = cpu_seconds()
        return check_launches(_exit_code(lambda: sys.exit(kernels.main(argv[1:]))), ready,
                              static=False)
    kernels.compile_all = record_compiles
    kernels.warm_all = record_cupy_compiles
    return _exit_code(lambda: sys.exit(kernels.main(argv[1:])))


_cek_phase: list = []  # the compile step's cek kernels, as modelled: (seconds, how)


def record_compiles(kernels: list, jobs: int) -> int:
    """The compile step's cek kernels, rehearsed: each kernel recorded, NVRTC timed on a few of
    them here, modelled as its workers' start-up and its compiles shared among GPU_CORES."""
    RECORD.mkdir(parents=True, exist_ok=True)
    (RECORD / "compiled.txt").write_text("".join(f"{k.id}\n" for k in kernels))
    for kernel in kernels:
        print(f"{kernel.id}: recorded", flush=True)
    seconds = nvrtc_seconds(RECORD, kernels)
    worker = worker_start("cupy, cek.gpu")
    # There, --jobs is one worker a core: GPU_CORES.
    rounds = math.ceil(len(kernels) / GPU_CORES)
    _cek_phase[:] = [worker + rounds * seconds,
                     f"{len(kernels)} kernels in {rounds} rounds of {GPU_CORES} workers x "
                     f"{seconds:.2f}s NVRTC each, a worker's start-up {worker:.1f}s here"]
    return 0


def record_cupy_compiles(calls: list, jobs: int) -> int:
    """The compile step's bench calls, rehearsed: each run on the stand-in, small, the CuPy
    kernels it reaches recorded (the warm step and the timed ones find them compiled); modelled
    as the cek kernels before them, then the calls in rounds of GPU_CORES workers, each round
    as long as its call that reaches the most, each of those a cold compile."""
    from cek.cli import main

    plant_standin()
    elementwise, reduction = cupy_seconds(RECORD)
    reached, failed = [], 0
    for args in calls:
        _cupy.clear()
        failed += _exit_code(lambda: main(["bench", *shrunk(args)], prog_name="cek")) != 0
        reductions = sum(".reduce" in kernel for kernel in _cupy)
        reached.append(((len(_cupy) - reductions) * elementwise + reductions * reduction,
                        set(_cupy)))
    every = set().union(*(kernels for _, kernels in reached))
    (RECORD / "cupy_compiled.txt").write_text("".join(f"{k}\n" for k in sorted(every)))
    worker = worker_start("cupy, torch, cek.bench")
    rounds = [max(s for s, _ in reached[i:i + GPU_CORES])
              for i in range(0, len(reached), GPU_CORES)]
    cek_s, cek_how = _cek_phase or [0.0, "no cek kernels"]
    verdict([], cek_s + worker + sum(rounds),
            f"{cek_how}; then {len(calls)} bench calls in {len(rounds)} rounds of {GPU_CORES} "
            f"workers, {len(every)} of CuPy's kernels, a round as long as its call with the "
            f"most ({max((len(k) for _, k in reached), default=0)}: {sum(rounds):.1f}s at "
            f"{elementwise:.2f}s, reductions {reduction:.2f}s), a worker's start-up "
            f"{worker:.1f}s here")
    return failed


def doctor() -> int:
    """The real doctor: its report must end, with one of its documented exits (0, 1, and
    doctor_fixes' TORCH_ON_CPU and NO_DRIVER: no driver here), and no traceback."""
    from cek.doctor_fixes import NO_DRIVER, TORCH_ON_CPU

    done = subprocess.run([sys.executable, "-m", "cek", "doctor"], capture_output=True,
                          text=True, check=False)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    failures = []
    if done.returncode not in (0, 1, TORCH_ON_CPU, NO_DRIVER):
        failures.append(f"cek doctor exited {done.returncode}")
    if "Traceback" in done.stdout + done.stderr:
        failures.append("cek doctor ended in a traceback")
    if "verdict" not in done.stdout:
        failures.append("cek doctor gave no verdict")
    # No GPU here: no launch, so its compiles (two kernels, forward and backward, two dtypes)
    # are counted in.
    own = cpu_seconds()
    seconds = nvrtc_seconds(RECORD)
    return 0 if verdict(failures, own + 6 * seconds,
                        f"{own:.1f}s here, 6 NVRTC compiles x {seconds:.2f}s") else 1


def gpu_tier(argv: list[str]) -> int:
    """The gpu tier's command with one xdist worker in place of its -n: the same plugin, file
    distribution, -v and deselection. There, each of the -n workers starts, imports and collects
    every test file on a core of its own (GPU_CORES is more than -n), so the tier's start is one
    worker's, which one worker here measures; -n workers on this machine's 2 cores would time
    their collections queueing for a core, a figure of this machine. The tests skip here (no
    GPU), so what their workers do on the CPU there is modelled: the slower of the worker that
    runs the tests compiled with torch.compile, each a cold compile, and the one that runs
    tests/test_cosine_embedding_loss.py, whose float64 references (gpu_tier_references) are the
    tier's longest CPU work. Their GPU time is not in the model, nor NVRTC, since the compile
    step compiled every kernel instance before them."""
    at = argv.index("-n")
    workers, argv = argv[at + 1], [*argv[:at + 1], "1", *argv[at + 2:]]
    counted = RECORD / "gpu_tier_compiles"
    RECORD.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts"),
                                                        os.environ.get("PYTHONPATH", "")]),
           "CEK_REHEARSE_COMPILES": str(counted)}
    code = subprocess.run([sys.executable, *argv[:2], "-p", "rehearse", *argv[2:]], check=False,
                          env=env).returncode
    own = cpu_seconds()
    compiles = int(counted.read_text()) if counted.exists() else 0
    compile_s = torch_compile_seconds(RECORD) if compiles else 0.0
    references = gpu_tier_references(RECORD)
    slowest = max(compiles * compile_s, references)
    ok = verdict([], own + slowest,
                 f"one worker's start, collection and skips {own:.1f}s here; there {workers} "
                 f"workers on {GPU_CORES} cores, each a core of its own, the slowest "
                 f"{slowest:.1f}s: torch.compile in {compiles} of its tests x {compile_s:.1f}s, the "
                 f"float64 references of test_cosine_embedding_loss.py {references:.1f}s")
    return code or (0 if ok else 1)


def pytest_collection_finish(session):
    """As a pytest plugin (`-p rehearse`, in the gpu tier rehearsed): how many gpu tests call
    torch.compile, each a cold compile on the GPU machine, into CEK_REHEARSE_COMPILES."""
    import inspect

    path = os.environ.get("CEK_REHEARSE_COMPILES")
    if path:
        count = sum(item.get_closest_marker("gpu") is not None
                    and "torch.compile(" in inspect.getsource(item.function)
                    for item in session.items if hasattr(item, "function"))
        Path(path).write_text(str(count))


def as_it_is(argv: list[str]) -> int:
    """A command run unchanged; inside a step, its time here is the model."""
    code = subprocess.run([sys.executable, *argv], check=False).returncode
    if not os.environ.get("CEK_STEP"):
        return code
    own = cpu_seconds()
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
