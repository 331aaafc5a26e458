"""Compile a Kernel to PTX and CUBIN with NVRTC, without a GPU or a driver.

NVRTC needs no device: `cuda.bindings.nvrtc` (NVIDIA's cuda-python) with the `nvidia-cuda-nvrtc`
library compiles for any `sm_XX` here. CuPy's public compile path asks the device for its
architecture and so cannot serve a GPU-free compile. ptxas's `-v` report, in the program log,
gives registers, spills, stack and shared memory.

The compile is CuPy's: `nvrtc_options` is the list a `cupy.RawModule` built from
`LOADER_OPTIONS` hands NVRTC for the same architecture (less CuPy's include directories, which
cek's self-contained sources never search), so `cek compile` and its report read the cubin a
launch gets. tests/test_compile.py captures CuPy's own list and SASS to hold this true.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field

from cek.kernel import Kernel

# What cek hands cupy.RawModule. -lineinfo costs no instruction and lets nvdisasm -g name the
# source line of every instruction (the report reads it).
LOADER_OPTIONS = ("-std=c++17", "-lineinfo")
# What CuPy's compile adds itself, in its order (cupy/cuda/compiler.py): -ftz=true on every
# compile (float32 subnormals read and written as zero; the emulator flushes alike), then the
# architecture, then --device-as-default-execution-space, which NVRTC before 13.2 needs for the
# generic lambdas of kernels/cek_row.cuh (without it 12.x and 13.0 call them host functions).
CUPY_ADDED_BEFORE_ARCH = ("-ftz=true",)
CUPY_ADDED_AFTER_ARCH = ("--device-as-default-execution-space",)
# The oldest NVRTC every kernel is compiled with in CI (.ci/nvrtc-matrix.txt): CuPy 14's oldest
# CUDA 12. An older one gets the upgrade in its error message.
OLDEST_TESTED_NVRTC = (12, 0)


def nvrtc_options(arch: str) -> tuple[str, ...]:
    """The options NVRTC gets for `arch` (sm_90), from cek compile and from CuPy alike."""
    return (*LOADER_OPTIONS, *CUPY_ADDED_BEFORE_ARCH, f"-arch={arch}", *CUPY_ADDED_AFTER_ARCH)


class CompileError(RuntimeError):
    """The compiler rejected a kernel; `log` holds its full output. `nvrtc`: the NVRTC version
    (major, minor) that compiled, named in the message with an upgrade hint when it is older
    than any cek is tested with; None for another compiler (the emulator's g++)."""

    def __init__(self, kernel_id: str, log: str, nvrtc: tuple[int, int] | None = None,
                 upgrade: str = "pip install -U nvidia-cuda-nvrtc"):
        compiler = "" if nvrtc is None else f" with NVRTC {nvrtc[0]}.{nvrtc[1]}"
        super().__init__(f"compiling {kernel_id}{compiler} failed:\n{log}"
                         + _upgrade_hint(nvrtc, upgrade))
        self.log = log
        self.nvrtc = nvrtc


def _upgrade_hint(nvrtc: tuple[int, int] | None, upgrade: str) -> str:
    if nvrtc is None or tuple(nvrtc) >= OLDEST_TESTED_NVRTC:
        return ""
    oldest = ".".join(map(str, OLDEST_TESTED_NVRTC))
    return (f"\nNVRTC {nvrtc[0]}.{nvrtc[1]} is older than the oldest cek is tested with "
            f"({oldest}): {upgrade}")


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


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library cek compiles with."""
    major, minor = _check(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


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
        # -Xptxas -v only prints ptxas's resource report (tests compare the SASS with CuPy's).
        opts = [*nvrtc_options(arch), *options, "-Xptxas", "-v"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = _read(nvrtc, prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
        log = log.rstrip(b"\0").decode()
        if int(err) != 0:
            raise CompileError(kernel.id, log, nvrtc_version())
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
