"""Compile, with CuPy on this machine's GPU, every kernel the `cek bench` steps of a script
launch, before any of them is timed: CuPy keeps each module in its disk cache, where the steps'
processes then find it, so no step's timeout pays NVRTC. scripts/device_check.sh runs it right
after its preflight.

    python scripts/compile_kernels.py scripts/device_check.sh [--jobs 8] [--list]

The kernels are read from the script's `bench NAME TIMEOUT ARGS...` lines: each --kernel (fused
by default) at each --dtype (f32 by default) and the BLOCK_SIZE of each --n-dim; with a split
pair's second kernel, its first (split-sums); with the fused kernels, the reduction of their
losses (a mean's second launch); with a cek.torch provider, the kernels a cek.torch training
step launches at that shape, eager and compiled. --list prints the kernel ids
and compiles nothing. Exit 1 if any kernel fails to compile.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import re
import shlex
import sys
import time
from pathlib import Path

# What a cek.torch training step launches for a mean: the eager route (fused forward, keep
# backward) and the compiled one (the custom ops: forward rows, backward rows), both reducing;
# where it splits a few wide rows, the split's pairs of each.
CEK_TORCH_KERNELS = ("fused", "backward-keep", "forward-rows", "backward-rows")
CEK_TORCH_SPLIT_KERNELS = ("fused-split", "backward-keep-split", "forward-split",
                           "backward-split")


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


def kernels_of(args: list[str]) -> set[tuple[str, str, int]]:
    """(kernel short name, dtype, n_dim) of everything a `cek bench` call launches."""
    from cek.bench import CEK_TORCH_PROVIDERS

    from cek import bench
    from cek import cosine_embedding_loss_split as split
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
                launched += (CEK_TORCH_SPLIT_KERNELS if split.splits(n_rows, n_dim, dtype)
                             else CEK_TORCH_KERNELS)
            out |= {(name, dtype, n_dim) for name in launched}
            if any(kernel_classes()[name].first is not None for name in launched):
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


def _compile(kernel) -> tuple[str, float, str]:
    """(id, seconds, error or "") of one CuPy compile and load, in a worker process."""
    from cek import gpu

    start = time.perf_counter()
    try:
        gpu.get_function(kernel)
    except Exception as exc:  # noqa: BLE001 - reported by the parent, with the kernel's id
        return kernel.id, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"
    return kernel.id, time.perf_counter() - start, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", type=Path)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--list", action="store_true", help="print the kernels, compile none")
    args = parser.parse_args()
    kernels = kernels_for(args.script.read_text())
    if args.list:
        print("\n".join(kernel.id for kernel in kernels))
        return 0
    start, failed = time.perf_counter(), 0
    # Workers of their own (spawned: CUDA does not survive a fork), each compiling with CuPy.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        for kernel_id, seconds, error in pool.map(_compile, kernels):
            print(f"{kernel_id}: {error or 'compiled'} in {seconds:.1f}s", flush=True)
            failed += bool(error)
    print(f"{len(kernels) - failed} of {len(kernels)} kernels compiled in "
          f"{time.perf_counter() - start:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
