"""Compile a Kernel to PTX and CUBIN with NVRTC, without a GPU or a driver.

NVRTC needs no device: it compiles for any `sm_XX` here. CuPy's public compile path asks the
device for its architecture and so cannot serve a GPU-free compile; its NVRTC binding can.
ptxas's `-v` report, in the program log, gives registers, spills, stack and shared memory.

The compile is CuPy's: `nvrtc_options` is the list a `cupy.RawModule` built from
`LOADER_OPTIONS` hands NVRTC for the same architecture (less CuPy's include directories, which
cek's self-contained sources never search), so `cek compile` and its report read the cubin a
launch gets. tests/test_nvrtc.py captures CuPy's own list and SASS to hold this true.

The NVRTC is CuPy's where CuPy is installed (`cupy.cuda.nvrtc`: the very library CuPy's
launches compile with, 12.x for CuPy for CUDA 12); without CuPy, NVIDIA's binding
(`cuda.bindings.nvrtc`) with the `nvidia-cuda-nvrtc` wheel, the `nvrtc` extra. cek never
installs an NVRTC beside CuPy's: one of another CUDA major would be loaded by every CuPy
compile in that environment, cek's and the user's own.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cek.kernel import Kernel

# What cek hands cupy.RawModule. -lineinfo costs no instruction and lets nvdisasm -g name the
# source line of every instruction (the report reads it).
LOADER_OPTIONS = ("-std=c++17", "-lineinfo")
# What CuPy's compile adds itself, in its order (cupy/cuda/compiler.py): -ftz=true on every
# compile (float32 subnormals read and written as zero; the emulator flushes alike), then the
# architecture, then --device-as-default-execution-space, which NVRTC before 13.2 needs for the
# generic lambdas of kernels/cek_block_row.cuh (without it 12.x and 13.0 call them host functions).
CUPY_ADDED_BEFORE_ARCH = ("-ftz=true",)
CUPY_ADDED_AFTER_ARCH = ("--device-as-default-execution-space",)
# The oldest NVRTC every kernel is compiled with in CI (.ci/nvrtc-matrix.txt): CuPy 14's oldest
# CUDA 12. An older one gets the upgrade in its error message.
OLDEST_TESTED_NVRTC = (12, 0)
# The oldest arch cek compiles for: Volta, the oldest the compile tier holds every kernel to 0
# spills on (NVRTC 12). NVRTC 12 knows older ones (sm_50 on), CUDA 12 deprecates them, NVRTC 13
# starts at sm_75: an older arch is refused as one the NVRTC does not know, not served untested.
OLDEST_ARCH = 70


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


def nvrtc_wheel(major: int) -> str:
    """The wheel that brings NVRTC `major`.x: its name changed with CUDA 13."""
    return "nvidia-cuda-nvrtc-cu12" if major == 12 else "nvidia-cuda-nvrtc"


NO_NVRTC = ("cek compile needs NVRTC: with CuPy, the one CuPy loads (pip install '.[cuda12]' or "
            "'.[cuda13]', by the CUDA version nvidia-smi shows); without CuPy, pip install "
            "'.[nvrtc]'")


class _CupyNvrtc:
    """CuPy's NVRTC binding (cupy.cuda.nvrtc): the library CuPy's own compiles load."""

    name = "CuPy's"

    def __init__(self, nvrtc, runtime):
        self._nvrtc = nvrtc
        self._runtime = runtime  # CuPy's CUDA runtime API: which CUDA it was built for

    def version(self) -> tuple[int, int]:
        try:
            major, minor = self._nvrtc.getVersion()
        except Exception as exc:  # no libnvrtc found (cuda.pathfinder's DynamicLibNotFoundError)
            raise RuntimeError(f"CuPy cannot load an NVRTC ({str(exc).strip()}): pip install "
                               f"{self._wheel()}") from exc
        return int(major), int(minor)

    def upgrade(self) -> str:
        return f"pip install -U {self._wheel()} (the NVRTC CuPy loads)"

    def archs(self) -> tuple[int, ...]:
        return tuple(int(a) for a in self._nvrtc.getSupportedArchs())

    def _wheel(self) -> str:
        """The NVRTC wheel of CuPy's own CUDA major, whatever NVRTC it found instead."""
        return nvrtc_wheel(self._runtime.runtimeGetVersion() // 1000)

    def compile(self, source: str, name: str, options: list[str]) -> tuple[str, str, bytes] | str:
        """(log, ptx, cubin), or the log alone when NVRTC refused the source."""
        nvrtc = self._nvrtc
        prog = nvrtc.createProgram(source, name, (), ())
        try:
            try:
                nvrtc.compileProgram(prog, options)
            except nvrtc.NVRTCError:
                return nvrtc.getProgramLog(prog).rstrip("\0")
            ptx = nvrtc.getPTX(prog).rstrip(b"\0").decode()
            return nvrtc.getProgramLog(prog).rstrip("\0"), ptx, whole_elf(nvrtc.getCUBIN(prog))
        finally:
            nvrtc.destroyProgram(prog)


class _BindingsNvrtc:
    """NVIDIA's binding (cuda.bindings.nvrtc), which loads the nvidia-cuda-nvrtc wheel's library:
    cek's own NVRTC, for a machine without CuPy."""

    name = "cuda-bindings'"

    def __init__(self, nvrtc):
        self._nvrtc = nvrtc

    def version(self) -> tuple[int, int]:
        try:
            major, minor = _check(self._nvrtc.nvrtcVersion(), "nvrtcVersion")
        except RuntimeError as exc:  # the binding is there, the library is not
            raise RuntimeError(f"{NO_NVRTC} ({str(exc).strip()})") from exc
        return int(major), int(minor)

    def upgrade(self) -> str:
        return "pip install -U nvidia-cuda-nvrtc"

    def archs(self) -> tuple[int, ...]:
        return tuple(int(a) for a in _check(self._nvrtc.nvrtcGetSupportedArchs(),
                                            "nvrtcGetSupportedArchs"))

    def compile(self, source: str, name: str, options: list[str]) -> tuple[str, str, bytes] | str:
        """(log, ptx, cubin), or the log alone when NVRTC refused the source."""
        nvrtc = self._nvrtc
        prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []),
                      "nvrtcCreateProgram")
        try:
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
            log = _read(nvrtc, prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
            log = log.rstrip(b"\0").decode()
            if int(err) != 0:
                return log
            ptx = _read(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
            cubin = _read(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
            return log, ptx.rstrip(b"\0").decode(), cubin
        finally:
            nvrtc.nvrtcDestroyProgram(prog)


@functools.cache
def _nvrtc() -> _CupyNvrtc | _BindingsNvrtc:
    """CuPy's NVRTC where CuPy is installed, so that cek compiles with the library CuPy's
    launches compile with, whichever CUDA major; else cuda-bindings' (the `nvrtc` extra)."""
    if importlib.util.find_spec("cupy_backends") is not None:  # CuPy's wheel, not a stand-in
        try:
            from cupy_backends.cuda.api import runtime
            from cupy_backends.cuda.libs import nvrtc
        except Exception:  # noqa: BLE001 - a CuPy that cannot load compiles nothing to match
            pass
        else:
            return _CupyNvrtc(nvrtc, runtime)
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise RuntimeError(NO_NVRTC) from None
    return _BindingsNvrtc(nvrtc)


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


def whole_elf(image: bytes) -> bytes:
    """CuPy's binding reads NVRTC's cubin one byte short (its last, a NUL): the driver loads it
    all the same, nvdisasm wants the file whole. An ELF64 ends with its section or program
    header table, whichever comes last; an image of any other length is returned as it is."""
    def field(at, size):
        return int.from_bytes(image[at:at + size], "little")

    if image[:4] != b"\x7fELF":
        return image
    end = max(field(0x28, 8) + field(0x3A, 2) * field(0x3C, 2),   # section headers
              field(0x20, 8) + field(0x36, 2) * field(0x38, 2))   # program headers
    return image + b"\0" if end == len(image) + 1 else image


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC cek compiles with (nvrtc_provider says whose binding); a
    RuntimeError that says what to install when there is none."""
    return _nvrtc().version()


def nvrtc_provider() -> str:
    """Whose NVRTC cek compiles with: "CuPy's" or "cuda-bindings'"."""
    return _nvrtc().name


def known_archs() -> tuple[str, ...]:
    """The archs cek compiles for with this NVRTC: those it knows (nvrtcGetSupportedArchs), from
    OLDEST_ARCH on, as sm_XX."""
    return tuple(f"sm_{a}" for a in sorted(_nvrtc().archs()) if a >= OLDEST_ARCH)


def check_arch(arch: str) -> None:
    """ValueError unless `arch` is a real architecture (sm_90, sm_90a, sm_100f) of known_archs:
    said before anything compiles, naming the ones there are."""
    match = re.fullmatch(r"sm_(\d+)[af]?", arch)
    if not match:
        raise ValueError(f"arch must look like sm_90, got {arch!r}")
    known = known_archs()
    if f"sm_{match.group(1)}" not in known:
        major, minor = nvrtc_version()
        raise ValueError(f"{arch} is not an arch cek compiles for with NVRTC {major}.{minor}: "
                         f"give one of {', '.join(known)}")


def _number(pattern: str, log: str) -> int:
    match = re.search(pattern, log)
    return int(match.group(1)) if match else 0


def compile_kernel(kernel: Kernel, arch: str = "sm_90", options: tuple[str, ...] = ()) -> CompileResult:
    """Compile `kernel.source` for `arch` (a real architecture such as sm_80 or sm_90, one of
    known_archs(): check_arch says why not)."""
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise ValueError(f"arch must look like sm_90, got {arch!r}")
    binding = _nvrtc()
    check_arch(arch)
    start = time.perf_counter()
    # -Xptxas -v only prints ptxas's resource report (tests compare the SASS with CuPy's).
    out = binding.compile(kernel.source, f"{kernel.id}.cu",
                          [*nvrtc_options(arch), *options, "-Xptxas", "-v"])
    if isinstance(out, str):
        raise CompileError(kernel.id, out, binding.version(), binding.upgrade())
    log, ptx, cubin = out
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
