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
of a problem too big to fill; plain mode only (a sanitized launch copies whole arrays).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from cek.compile import CompileError
from cek.emulate import build, runner, sanitize as sanitized
from cek.emulate.errors import KernelError
from cek.kernel import Kernel

__all__ = ["CompileError", "KernelError", "load"]

_FLAVOURS = {None: "plain", "thread": "thread", "address": "address"}


def load(kernel: Kernel, *, sanitize: str | None = None,
         schedule: str = "forward") -> Callable[..., None]:
    """A launcher `f(grid, block, args, *, shared_mem=0, first_block=0)` for `kernel`, as CuPy's
    RawKernel has (plus first_block), taking NumPy arrays where the GPU takes CuPy arrays.
    Builds (or finds cached) the library."""
    if sanitize not in _FLAVOURS:
        raise ValueError(f"sanitize must be None, 'thread' or 'address', got {sanitize!r}")
    flavour = _FLAVOURS[sanitize]
    order = runner.parse_schedule(schedule)
    path = str(build.library(kernel, flavour))
    library = runner.open_library(path) if flavour == "plain" else None
    ctypes_of_args = [kernel.c_type(arg) for arg in kernel.args]

    def launch(grid, block, args: Sequence, *, shared_mem: int = 0, first_block: int = 0) -> None:
        cast = kernel.check_args(args, (np.ndarray,))
        for spec, value in zip(kernel.args, cast):
            if spec.output and not value.flags.writeable:
                raise ValueError(f"{spec.name} must be writeable")
        grid3 = runner.launch_dims(grid, "grid")
        block3 = runner.launch_dims(block, "block")
        smem = runner.check_shared_mem(shared_mem)
        first = runner.check_first_block(first_block)
        if library is None and first:
            raise ValueError(f"first_block={first_block!r} needs sanitize=None: a sanitized "
                             "launch copies whole arrays")
        if library is None:
            sanitized.launch(path, flavour, ctypes_of_args, cast, grid3, block3, smem, order)
            return
        values = [v.ctypes.data if isinstance(v, np.ndarray) else v for v in cast]
        error = library.launch(grid3, block3, runner.arg_values(ctypes_of_args, values), smem,
                               order, first)
        if error:
            raise KernelError(error)

    launch.kernel = kernel
    launch.library = path
    return launch
