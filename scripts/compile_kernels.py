"""Compile, with CuPy on this machine's GPU, every kernel the `cek bench` steps of a script
launch, before any of them is timed: CuPy keeps each module in its disk cache, where the steps'
processes then find it, so no step's timeout pays NVRTC. scripts/device_check.sh runs it right
after its preflight.

    python scripts/compile_kernels.py scripts/device_check.sh [--jobs N] [--all] [--warm] [--list]

--all compiles, after the bench steps' kernels, every other kernel instance (each class, dtype
and BLOCK_SIZE): what the gpu test tier launches is among them, whatever widths its tests take.
Then each bench call runs once at a few rows (torch.compile's baselines left out), each in a
worker of its own, so that CuPy's own kernels that the call reaches (the baselines' math, cek's
glue, the checks) are compiled into CuPy's disk cache on every core too, not one after the
other in the warm step. --warm, in place of compiling, runs each
bench call once in this process, so that any of CuPy's kernels and torch's still cold are
compiled before any step is timed. --jobs: worker processes (default: one a CPU).

The kernels are read from the script's `bench NAME TIMEOUT ARGS...` lines, a `--preset NAME`
call taken as the calls of its shapes (plain_calls): each --kernel (fused
by default) at each --dtype (f32 by default) and the BLOCK_SIZE of each --n-dim; with a split
pair's second kernel, its first (split-sums); with the fused kernels, the reduction of their
losses (a mean's second launch); with a cek.torch provider, the kernels of a cek.torch training
step's plans at that shape, eager and compiled (cek.plan). --list prints the kernel ids
and compiles nothing. Exit 1 if any kernel fails to compile.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import re
import shlex
import sys
import time
from pathlib import Path

# The routes of a cek.torch training step: eager (and from a CUDA graph) and compiled.
CEK_TORCH_ROUTES = ("torch", "torch-compile")
# The rows of a warm call: enough for each provider's path, few enough to take no time.
WARM_ROWS, SPLIT_ROWS = 64, 256
MIN_REPEAT = 50  # the fewest repetitions `cek bench --repeat` takes


def script_lines(script: str) -> list[str]:
    """A shell script's lines, backslash continuations joined and the variables it sets with
    NAME="..." lines expanded where they are used as $NAME."""
    lines, variables = [], {}
    for line in script.replace("\\\n", " ").splitlines():
        for name, value in sorted(variables.items(), key=lambda item: -len(item[0])):
            line = line.replace(f"${name}", value)
        if match := re.fullmatch(r'([A-Z_]+)="(.*)"', line):
            variables[match[1]] = match[2]
        lines.append(line)
    return lines


def bench_calls(script: str) -> list[list[str]]:
    """The arguments of every `bench NAME TIMEOUT ...` line of a shell script."""
    return [shlex.split(line)[3:] for line in script_lines(script)
            if re.match(r"bench \w+ \d+ ", line)]


def _values(args: list[str], option: str, default: list[str]) -> list[str]:
    found = [args[i + 1] for i, a in enumerate(args[:-1]) if a == option]
    return found or default


def preset_args(args: list[str]) -> tuple[list[tuple[int, int]], list[str]]:
    """((N, D) of each shape, the other arguments) of a `cek bench --preset NAME` call, as
    `cek bench` expands it from cek.bench.PRESETS: the preset's shapes and kernels, its dtypes
    and baselines where the call gives no --dtype or --baseline of its own. A call without
    --preset: no shapes, its arguments as they are."""
    from cek.bench import PRESETS

    at = args.index("--preset") if "--preset" in args[:-1] else None
    if at is None:
        return [], list(args)
    preset, rest = PRESETS[args[at + 1]], [*args[:at], *args[at + 2:]]
    rest += [a for name in preset["kernels"] for a in ("--kernel", name)]
    if "--dtype" not in rest:
        rest += [a for dtype in preset["dtypes"] for a in ("--dtype", dtype)]
    if "--baseline" not in rest:
        rest += ["--baseline", ",".join(preset["baselines"])]
    return list(preset["shapes"]), rest


def plain_calls(args: list[str]) -> list[list[str]]:
    """A `cek bench` call as calls without --preset: a preset's, one a shape (--n-dim D
    --n-rows N); any other, itself."""
    shapes, rest = preset_args(args)
    if not shapes:
        return [rest]
    return [["--n-dim", str(n_dim), "--n-rows", str(n_rows), *rest] for n_rows, n_dim in shapes]


def kernels_of(args: list[str]) -> set[tuple[str, str, int]]:
    """(kernel short name, dtype, n_dim) of everything a `cek bench` call launches."""
    return set().union(*map(_kernels_of_plain, plain_calls(args)))


def _kernels_of_plain(args: list[str]) -> set[tuple[str, str, int]]:
    from cek import bench, plan
    from cek.bench_providers import CEK_TORCH_PROVIDERS
    from cek.kernel import kernel_classes

    names = _values(args, "--kernel", ["fused"])
    baselines = ",".join(_values(args, "--baseline", [""])).split(",")
    rows = _values(args, "--n-rows", ["65536"])[0]
    out = set()
    for dtype in _values(args, "--dtype", ["f32"]):
        for n_dim in map(int, _values(args, "--n-dim", [])):
            launched = list(names)
            if set(baselines) & set(CEK_TORCH_PROVIDERS):
                n_rows = bench.auto_rows(n_dim) if rows == "auto" else int(rows)
                launched += [launch.name for route in CEK_TORCH_ROUTES for launch in
                             plan.plan(n_rows, n_dim, dtype, reduction="mean",
                                       route=route).launches]
            out |= {(name, dtype, n_dim) for name in launched}
            if any(kernel_classes()[name].first is not None for name in names):
                out.add(("split-sums", dtype, n_dim))  # a pair's first launch
            if {"fused", "fused-split"} & set(launched):
                out.add(("reduce", dtype, n_dim))
    return out


def kernels_for(script: str) -> list:
    """The distinct Kernel instances the script's bench calls launch, in a stable order."""
    from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
    from cek.kernel import kernel_classes

    classes = {**kernel_classes(), "reduce": CosineEmbeddingLossReduce}
    found = {classes[name].for_n_dim(n_dim, dtype)
             for args in bench_calls(script) for name, dtype, n_dim in kernels_of(args)}
    return sorted(found, key=lambda kernel: kernel.id)


def every_kernel() -> list:
    """Every kernel instance cek has: each class at each dtype and BLOCK_SIZE, and the
    reduction at each dtype."""
    from cek import dtypes
    from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
    from cek.kernel import kernel_classes

    found = {cls.for_n_dim(size, dtype) for cls in kernel_classes().values()
             for dtype in dtypes.DTYPES for size in cls.block_sizes()}
    found |= {CosineEmbeddingLossReduce.for_dtype(dtype) for dtype in dtypes.DTYPES}
    return sorted(found, key=lambda kernel: kernel.id)


def selected(script: str, every: bool) -> list:
    """The script's kernels first (its timed steps need them first), then, with `every`, the
    rest of every_kernel()."""
    first = kernels_for(script)
    return first + ([k for k in every_kernel() if k not in set(first)] if every else [])


def warm_calls(script: str) -> list[list[str]]:
    """`cek bench` arguments that run each bench call of the script at WARM_ROWS rows (its own
    count up to SPLIT_ROWS: whether a few wide rows split depends on it; a preset's call, each
    of its shapes so, those at the same rows in one call), repeated as few times as `cek bench`
    takes, without torch.compile's baselines (their compiles are the last step's to time),
    output unused."""
    return [call for line in bench_calls(script)
            for call in _merged([_warm(args) for args in plain_calls(line)])]


def _warm(args: list[str]) -> list[str]:
    """One plain `cek bench` call made a warm one (warm_calls)."""
    args = [*args, *([] if "--repeat" in args else ["--repeat", str(MIN_REPEAT)])]
    for i, arg in enumerate(args[:-1]):
        value = args[i + 1]
        if arg == "--n-rows":
            if value == "auto" or int(value) > SPLIT_ROWS:
                args[i + 1] = str(WARM_ROWS)
        elif arg == "--repeat":
            args[i + 1] = str(MIN_REPEAT)
        elif arg == "--baseline":
            kept = [b for b in value.split(",") if "compile" not in b]
            args[i + 1] = ",".join(kept) or "none"
        elif arg == "--plot":
            args[i:i + 2] = ["", ""]
    return [a for a in args if a]


def _merged(calls: list[list[str]]) -> list[list[str]]:
    """Calls that differ in their widths alone as one call of every width, in the first one's
    place (a preset's shapes at the same rows: one call, not one a shape)."""
    merged: dict[tuple, list[str]] = {}
    for args in calls:
        widths = _values(args, "--n-dim", [])
        rest = [a for i, a in enumerate(args)
                if a != "--n-dim" and (i == 0 or args[i - 1] != "--n-dim")]
        known = merged.setdefault(tuple(rest), [])
        known += [d for d in widths if d not in known]
    return [[*(a for d in widths for a in ("--n-dim", d)), *rest]
            for rest, widths in merged.items()]


def warm_one(args: list[str]) -> str:
    """One warm call through `cek bench` in this process: "warmed", or why it failed."""
    from cek import bench
    from cek.cli import main

    # The static figures compile with cek's own NVRTC and cache nothing on disk: no use here.
    bench.static_figures = lambda *args, **kwargs: None
    try:
        main(["bench", *args], prog_name="cek", standalone_mode=False)
    except Exception as exc:  # noqa: BLE001 - a baseline that fails here fails in its step
        return f"failed: {type(exc).__name__}: {exc}"
    return "warmed"


def warm(script: str) -> int:
    """Each warm call through `cek bench` in this process; the number that failed."""
    failed = 0
    for args in warm_calls(script):
        start = time.perf_counter()
        outcome = warm_one(args)
        failed += outcome != "warmed"
        print(f"warm {' '.join(args)}: {outcome} in {time.perf_counter() - start:.1f}s",
              flush=True)
    return failed


def warm_all(calls: list[list[str]], jobs: int) -> int:
    """Each warm call in a worker process of its own, `jobs` at a time: CuPy compiles its own
    kernels that the call reaches (the baselines' math, cek's glue, the checks) into its disk
    cache, where the warm step and the timed steps then find them, as they find cek's; a line
    each as it finishes; the number that failed."""
    failed = 0
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for args, seconds, outcome in pool.map(_warm_quietly, calls):
            print(f"CuPy's kernels of bench {' '.join(args)}: {outcome} in {seconds:.1f}s",
                  flush=True)
            failed += outcome != "warmed"
    return failed


def _warm_quietly(args: list[str]) -> tuple[list[str], float, str]:
    """(args, seconds, outcome) of warm_one in a worker, its table and progress left unsaid."""
    import contextlib
    import io

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        outcome = warm_one(args)
    return args, time.perf_counter() - start, outcome


def compile_all(kernels: list, jobs: int) -> int:
    """Each kernel compiled and loaded by CuPy in `jobs` worker processes, a line each as it
    finishes; the number that failed."""
    failed = 0
    # Workers of their own (spawned: CUDA does not survive a fork), each compiling with CuPy.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        for kernel_id, seconds, error in pool.map(_compile, kernels):
            print(f"{kernel_id}: {error or 'compiled'} in {seconds:.1f}s", flush=True)
            failed += bool(error)
    return failed


def _compile(kernel) -> tuple[str, float, str]:
    """(id, seconds, error or "") of one CuPy compile and load, in a worker process."""
    from cek import gpu

    start = time.perf_counter()
    try:
        gpu.get_function(kernel)
    except Exception as exc:  # noqa: BLE001 - reported by the parent, with the kernel's id
        return kernel.id, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"
    return kernel.id, time.perf_counter() - start, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", type=Path)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--all", action="store_true", help="every kernel instance too")
    parser.add_argument("--warm", action="store_true", help="run each bench call once instead")
    parser.add_argument("--list", action="store_true", help="print the kernels, compile none")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    script = args.script.read_text()
    start = time.perf_counter()
    if args.warm:
        failed = warm(script)
        print(f"{len(warm_calls(script)) - failed} of {len(warm_calls(script))} bench calls "
              f"warmed in {time.perf_counter() - start:.0f}s", flush=True)
        return 1 if failed else 0
    kernels = selected(script, args.all)
    if args.list:
        print("\n".join(kernel.id for kernel in kernels))
        return 0
    failed = compile_all(kernels, args.jobs)
    print(f"{len(kernels) - failed} of {len(kernels)} kernels compiled in "
          f"{time.perf_counter() - start:.0f}s", flush=True)
    calls = warm_calls(script)
    cold = warm_all(calls, args.jobs)
    print(f"CuPy's kernels of {len(calls) - cold} of {len(calls)} bench calls compiled, all in "
          f"{time.perf_counter() - start:.0f}s", flush=True)
    return 1 if failed or cold else 0


if __name__ == "__main__":
    sys.exit(main())
