"""Run a Kernel's exact CUDA source on the CPU, for machines without a GPU.

    f = cek.emulate.load(kernel)                      # sanitize=None, schedule="forward"
    grid, block, smem = kernel.launch_config(n_rows, n_dim)
    f(grid, block, args, shared_mem=smem)             # NumPy arrays, written in place

The source is compiled unmodified by g++ with `prelude.h` force-included; the CUDA subset it
supports, and the misuses it reports, are listed at the top of that file (SUBSET). Blocks run one
after another and the threads of a block run as fibers on one OS thread, switching at barriers
and shuffles in the order `schedule` names: "forward" (by thread index), "reverse" or
"random:<seed>". A race-free kernel gives bitwise identical results under every schedule.

sanitize="thread" or "address" runs each launch in a subprocess under ThreadSanitizer or
AddressSanitizer. Every failure found in a kernel is a KernelError, with the kernel's file and
line when known; a source the compiler rejects is a cek.compile.CompileError.

first_block runs blocks first_block.. of the grid (linear index, x fastest), e.g. the last rows
of a problem too big to fill, and blocks=K only K of them (a kernel whose first blocks take the
last rows, as the split's gradient kernels do); plain mode only (a sanitized launch copies whole
arrays).

    counts = cek.emulate.traffic(kernel, grid, block, args, shared_mem=smem)
    counts["x1"].reads == (1, 1) and counts["x1"].read == x1.nbytes   # every byte read once

launches like `load(kernel)` (in this process, outputs written) and counts the global-memory
traffic: per array argument, how many bytes were read and written at least once, and the fewest
and most reads (writes) of one such byte. The kernel is built in a "traffic" flavour in which g++
calls a counting hook before every load and store of the optimised code (traffic.cpp), so a
16-byte vector access counts once per byte like a scalar one, and an access outside the arrays
(shared memory, the stack) counts nowhere. An array passed as None must not be touched at all.
What is counted is g++'s code for the source: a load that only nvcc would merge or repeat is not.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from cek.compile import CompileError
from cek.emulate import build, runner, sanitize as sanitized
from cek.emulate.errors import CacheDirError, KernelError
from cek.kernel import Kernel

__all__ = ["CacheDirError", "CompileError", "KernelError", "Traffic", "load", "traffic"]

_FLAVOURS = {None: "plain", "thread": "thread", "address": "address"}


def load(kernel: Kernel, *, sanitize: str | None = None,
         schedule: str = "forward") -> Callable[..., None]:
    """A launcher `f(grid, block, args, *, shared_mem=0, first_block=0, blocks=None)` for
    `kernel`, as CuPy's RawKernel has (plus first_block and blocks: run that many blocks from
    first_block, None to the grid's end), taking NumPy arrays where the GPU takes CuPy arrays.
    Builds (or finds cached) the library."""
    if sanitize not in _FLAVOURS:
        raise ValueError(f"sanitize must be None, 'thread' or 'address', got {sanitize!r}")
    flavour = _FLAVOURS[sanitize]
    order = runner.parse_schedule(schedule)
    path = str(build.library(kernel, flavour))
    library = runner.open_library(path) if flavour == "plain" else None
    ctypes_of_args = [kernel.c_type(arg) for arg in kernel.args]

    def launch(grid, block, args: Sequence, *, shared_mem: int = 0, first_block: int = 0,
               blocks: int | None = None) -> None:
        cast, grid3, block3, smem = _checked(kernel, grid, block, args, shared_mem)
        first = runner.check_first_block(first_block)
        count = 0 if blocks is None else runner.check_first_block(blocks, "blocks")
        if blocks is not None and count == 0:
            raise ValueError("blocks must be at least 1, or None for the rest of the grid")
        if library is None and (first or count):
            raise ValueError(f"first_block={first_block!r}, blocks={blocks!r} need "
                             "sanitize=None: a sanitized launch copies whole arrays")
        if library is None:
            sanitized.launch(path, flavour, ctypes_of_args, cast, grid3, block3, smem, order)
            return
        values = [v.ctypes.data if isinstance(v, np.ndarray) else v for v in cast]
        error = library.launch(grid3, block3, runner.arg_values(ctypes_of_args, values), smem,
                               order, first, interruptible=True, block_count=count)
        if error:
            raise KernelError(error)

    launch.kernel = kernel
    launch.library = path
    return launch


def _checked(kernel: Kernel, grid, block, args: Sequence, shared_mem) -> tuple:
    """(args cast to their C types, grid, block, shared_mem), or the error a GPU launch gives."""
    cast = kernel.check_args(args, (np.ndarray,))
    kernel.check_launch_of(grid, block, cast)
    for spec, value in zip(kernel.args, cast):
        if spec.output and value is not None and not value.flags.writeable:
            raise ValueError(f"{spec.name} must be writeable")
    block3 = runner.launch_dims(block, "block")
    bound = launch_bound(kernel)
    threads = block3[0] * block3[1] * block3[2]
    if bound is not None and threads > bound:
        raise ValueError(f"block {block3} has {threads} threads, more than the {bound} of "
                         f"{kernel.entry_point_name()}'s __launch_bounds__: a GPU refuses it")
    return (cast, runner.launch_dims(grid, "grid"), block3, runner.check_shared_mem(shared_mem))


def launch_bound(kernel: Kernel) -> int | None:
    """The threads a block the entry point's __launch_bounds__ allows, as the source says (the
    driver reads the compiled value), or None where it declares none."""
    return _launch_bound(kernel.source, kernel.entry_point_name())


@functools.lru_cache(maxsize=256)
def _launch_bound(source: str, entry: str) -> int | None:
    match = re.search(r"__launch_bounds__\(\s*(\d+)[^)]*\)\s*" + re.escape(entry) + r"\s*\(",
                      source)
    return int(match[1]) if match else None


@dataclass(frozen=True)
class Traffic:
    """The global-memory traffic of one launch on one array argument, counted per byte."""

    size: int  # bytes of the array
    read: int  # bytes read at least once
    written: int  # bytes written at least once
    reads: tuple[int, int]  # fewest and most reads of a byte read at least once; (0, 0): none
    writes: tuple[int, int]


def _summary(counts: np.ndarray) -> tuple[int, tuple[int, int]]:
    touched = counts[counts > 0]
    if touched.size == 0:
        return 0, (0, 0)
    return int(touched.size), (int(touched.min()), int(touched.max()))


def traffic(kernel: Kernel, grid, block, args: Sequence, *, shared_mem: int = 0,
            schedule: str = "forward") -> dict[str, Traffic]:
    """Launch `kernel` on NumPy arrays as load(kernel) does and return the traffic of each array
    argument by name (an argument given as None has none: touching it is a KernelError)."""
    order = runner.parse_schedule(schedule)
    cast, grid3, block3, smem = _checked(kernel, grid, block, args, shared_mem)
    library = runner.open_library(str(build.library(kernel, "traffic")))
    named = dict(zip((spec.name for spec in kernel.args), cast))
    counters, watch = {}, []
    for spec, value in zip(kernel.args, cast):
        if not spec.is_pointer:
            continue
        if value is None:  # watched where the array would be if it started at address 0
            size = int(np.prod([named[s] for s in spec.shape])) * kernel.arg_dtype(spec).itemsize
            watch.append(runner.Watched(spec.name.encode(), 0, size, None, None))
            continue
        reads, writes = np.zeros(value.nbytes, np.uint32), np.zeros(value.nbytes, np.uint32)
        counters[spec.name] = (value.nbytes, reads, writes)
        watch.append(runner.Watched(spec.name.encode(), value.ctypes.data, value.nbytes,
                                    reads.ctypes.data, writes.ctypes.data))
    values = [v.ctypes.data if isinstance(v, np.ndarray) else v for v in cast]
    ctypes_of_args = [kernel.c_type(arg) for arg in kernel.args]
    error = library.launch(grid3, block3, runner.arg_values(ctypes_of_args, values), smem, order,
                           0, watch, interruptible=True)
    if error:
        raise KernelError(error)
    result = {}
    for name, (size, reads, writes) in counters.items():
        (read, read_range), (written, write_range) = _summary(reads), _summary(writes)
        result[name] = Traffic(size, read, written, read_range, write_range)
    return result
