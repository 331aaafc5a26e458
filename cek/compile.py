"""Compile a Kernel to PTX and CUBIN with NVRTC, without a GPU or a driver.

NVRTC needs no device: `cuda.bindings.nvrtc` (NVIDIA's cuda-python) with the `nvidia-cuda-nvrtc`
library compiles for any `sm_XX` here. CuPy's public compile path asks the device for its
architecture and so cannot serve a GPU-free compile. ptxas's `-v` report, in the program log,
gives registers, spills, stack and shared memory.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field

from cek.kernel import Kernel

# Options shared with the GPU loader, so a GPU-free compile checks what the GPU runs. CuPy adds
# -ftz=true to every compile (float32 subnormals read and written as zero); it is named here too
# so that `cek compile` produces the same code, and the emulator flushes float arithmetic alike.
COMMON_OPTIONS = ("-std=c++17", "-lineinfo", "-ftz=true")


class CompileError(RuntimeError):
    """The compiler rejected a kernel; `log` holds its full output."""

    def __init__(self, kernel_id: str, log: str):
        super().__init__(f"compiling {kernel_id} failed:\n{log}")
        self.log = log


@dataclass
class CompileResult:
    kernel_id: str
    arch: str
    ptx: str = field(repr=False)
    cubin: bytes = field(repr=False)
    log: str = field(repr=False)
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int
    local_bytes: int
    seconds: float

    def summary(self) -> dict:
        """The resource report without the binaries, for tables and JSON."""
        row = asdict(self)
        for big in ("ptx", "cubin", "log"):
            row.pop(big)
        return row


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - the package is a dependency
        raise RuntimeError(
            "compiling needs cuda-python's NVRTC binding: pip install cuda-bindings nvidia-cuda-nvrtc"
        ) from exc
    return nvrtc


def _check(result, what: str):
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"NVRTC {what} failed: {err!r}")
    return rest[0] if len(rest) == 1 else rest


def _read(nvrtc, prog, size_fn, get_fn) -> bytes:
    size = _check(size_fn(prog), size_fn.__name__)
    buf = b" " * size
    _check(get_fn(prog, buf), get_fn.__name__)
    return buf


def _number(pattern: str, log: str) -> int:
    match = re.search(pattern, log)
    return int(match.group(1)) if match else 0


def compile_kernel(kernel: Kernel, arch: str = "sm_90", options: tuple[str, ...] = ()) -> CompileResult:
    """Compile `kernel.source` for `arch` (a real architecture such as sm_80 or sm_90)."""
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"arch must look like sm_90, got {arch!r}")
    nvrtc = _nvrtc()
    start = time.perf_counter()
    prog = _check(
        nvrtc.nvrtcCreateProgram(kernel.source.encode(), f"{kernel.id}.cu".encode(), 0, [], []),
        "nvrtcCreateProgram",
    )
    try:
        opts = [f"-arch={arch}", "-Xptxas", "-v", *COMMON_OPTIONS, *options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _read(nvrtc, prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
        log = log.rstrip(b"\0").decode()
        if int(err) != 0:
            raise CompileError(kernel.id, log)
        ptx = _read(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX).rstrip(b"\0").decode()
        cubin = _read(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CompileResult(
        kernel_id=kernel.id,
        arch=arch,
        ptx=ptx,
        cubin=cubin,
        log=log,
        registers=_number(r"Used (\d+) registers", log),
        spill_stores=_number(r"(\d+) bytes spill stores", log),
        spill_loads=_number(r"(\d+) bytes spill loads", log),
        stack_bytes=_number(r"(\d+) bytes stack frame", log),
        shared_bytes=_number(r"(\d+) bytes smem", log),
        local_bytes=_number(r"(\d+) bytes lmem", log),
        seconds=time.perf_counter() - start,
    )
