"""`cek doctor`'s checks: what cek runs with on this machine, read fact by fact.

The one command to run after installing, and to paste into a bug report. Each fact
is read on its own, and whatever reading it raises becomes part of the fact ("CuPy: cannot
load: ...") instead of a traceback: the environments that need this command most are the
broken ones. The driver is asked through its own library (libcuda, by ctypes), not through
CuPy, so that a machine without CuPy learns which extra to install.

Where there is no NVIDIA driver, doctor tries instead what runs without one: the CPU path,
the emulator and `cek compile`, once each on the fused kernel. What stops each, and its fix,
is cek/doctor_fixes.py's; the lines and the command, cek/doctor_report.py's.

Exit 0 when the GPU path can run (no problem, and one real launch of the fused kernel matched
the CPU path), 1 when it cannot (or, without a driver, when what runs without one fails), 2 for
a bad option, 3 when the CuPy path runs on the GPU and cek.torch on the CPU only
(TORCH_ON_CPU), 4 without a driver when the CPU path, the emulator and `cek compile` work
(NO_DRIVER).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import cek
from cek.doctor_fixes import (EXTRAS, NO_DRIVER, TORCH_ON_CPU, Problem, _dotted,  # noqa: F401
                              exit_status, problems)

# What the one real launch runs: the fused kernel on the README's shape, as a training step
# (the mean and its gradients), against the CPU path on the same values.
LAUNCH_ROWS, LAUNCH_DIM, MARGIN = 64, 768, 0.2
DTYPE_NAMES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")  # the kernel module's, where loaded
# CUdevice_attribute values (cuda.h): the compute capability.
_CC_MAJOR, _CC_MINOR = 75, 76
_NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE
# What a bug report needs of the Python side, each to the patch level: the distributions that
# decide what cek compiles with and runs on (CuPy's is found by its prefix, cupy_wheels).
DISTRIBUTIONS = ("numpy", "click", "cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu12",
                 "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12", "torch")
ENVIRONMENT_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUPY_COMPILE_WITH_PTX")


@dataclass
class Facts:
    """What doctor found. A None value with its *_error set: reading it failed, and why."""

    driver: str | None = None          # the kernel module's version, 550.54.15
    driver_cuda: tuple | None = None   # the newest CUDA the driver runs, (12, 4)
    driver_error: str | None = None    # no driver, or no GPU it can list
    no_driver: bool = False            # no NVIDIA driver at all (no libcuda)
    gpus: list = field(default_factory=list)  # (name, sm_XY, memory bytes) each
    cupy: str | None = None            # "14.2.0 (cupy-cuda12x)"
    cupy_wheels: list = field(default_factory=list)  # the CuPy distributions installed
    cupy_error: str | None = None
    cupy_cuda: tuple | None = None     # the CUDA CuPy was built for
    cupy_devices: int = 0
    cupy_device_error: str | None = None
    nvrtc: tuple | None = None         # the NVRTC CuPy compiles with
    nvrtc_file: str | None = None
    nvrtc_error: str | None = None
    headers: str | None = None         # the CUDA headers CuPy compiles with
    headers_cuda: tuple | None = None
    headers_error: str | None = None
    compile_nvrtc: str | None = None   # `cek compile`'s NVRTC, "13.5 (CuPy's)"
    archs: list = field(default_factory=list)  # what it compiles for, ["sm_75", ...]
    compile_error: str | None = None
    torch: str | None = None
    torch_cuda: str | None = None      # torch.version.cuda: None for a CPU build
    torch_devices: int = 0
    torch_error: str | None = None
    launches: list = field(default_factory=list)  # {"what", "ok", "detail"} each
    runs_here: list = field(default_factory=list)  # without a driver: {"what", "ok", "detail"}




def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0]


def _cuda(version: int) -> tuple[int, int]:
    return version // 1000, version % 1000 // 10  # 12040: (12, 4)


# -- the facts ---------------------------------------------------------------------------------


def libcuda():
    """The driver's libcuda, or None where no NVIDIA driver is installed."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def read_driver(facts: Facts, lib) -> None:
    """The driver's version, the CUDA it supports and its GPUs, from `lib` (libcuda)."""
    if lib is None:
        facts.driver_error = "no NVIDIA driver (libcuda.so.1 is not installed)"
        facts.no_driver = True
        return
    try:
        facts.driver = re.search(r"Kernel Module\s+(\S+)", DRIVER_VERSION_FILE.read_text())[1]
    except (OSError, TypeError):  # no such file (a container may lack it), or another format
        facts.driver = nvml_driver_version(libnvml())
    version = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        facts.driver_error = "the NVIDIA driver does not say which CUDA it supports"
        return
    facts.driver_cuda = _cuda(version.value)
    status = lib.cuInit(0)
    count = ctypes.c_int()
    if status == 0:
        status = lib.cuDeviceGetCount(ctypes.byref(count))
    if status != 0 or count.value == 0:
        why = f" (CUDA error {status})" if status not in (0, _NO_DEVICE) else ""
        facts.driver_error = f"the NVIDIA driver sees no GPU{why}"
        return
    for index in range(count.value):
        facts.gpus.append(_gpu(lib, index))


def libnvml():
    """The driver's management library (NVML), or None."""
    try:
        return ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None


def nvml_driver_version(lib) -> str | None:
    """The driver's version as the driver itself gives it (NVML), or None."""
    if lib is None or lib.nvmlInit_v2() != 0:
        return None
    buffer = ctypes.create_string_buffer(80)
    try:
        if lib.nvmlSystemGetDriverVersion(buffer, len(buffer)) != 0:
            return None
        return buffer.value.decode(errors="replace")
    finally:
        lib.nvmlShutdown()


def _gpu(lib, index: int) -> tuple[str, str, int]:
    device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    name, memory = ctypes.create_string_buffer(256), ctypes.c_size_t()
    lib.cuDeviceGet(ctypes.byref(device), index)
    lib.cuDeviceGetName(name, len(name), device)
    lib.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, device)
    lib.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, device)
    lib.cuDeviceTotalMem_v2(ctypes.byref(memory), device)
    return name.value.decode(errors="replace"), f"sm_{major.value}{minor.value}", memory.value


def read_cupy(facts: Facts) -> None:
    """CuPy's version and CUDA, the GPUs it sees, its NVRTC and its CUDA headers."""
    facts.cupy_wheels = cupy_wheels()
    try:
        import cupy
    except ModuleNotFoundError as exc:
        facts.cupy_error = "not installed" if exc.name == "cupy" else _error(exc)
        return
    except Exception as exc:  # noqa: BLE001 - a CUDA library it cannot load, among others
        facts.cupy_error = f"cannot load: {_error(exc)}"
        return
    facts.cupy = f"{cupy.__version__} ({', '.join(facts.cupy_wheels) or 'no wheel found'})"
    runtime = cupy.cuda.runtime
    try:
        facts.cupy_cuda = _cuda(runtime.runtimeGetVersion())
        facts.cupy_devices = runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no driver, or one too old: cek.gpu says which
        from cek import gpu

        facts.cupy_device_error = gpu.no_device_reason() or "CuPy cannot reach a GPU"
    try:
        facts.nvrtc = tuple(cupy.cuda.nvrtc.getVersion())
        facts.nvrtc_file = loaded_library("libnvrtc.so")
    except Exception as exc:  # noqa: BLE001 - no libnvrtc found
        facts.nvrtc_error = _error(exc)
    _read_headers(facts, cupy)


def cupy_wheels() -> list[str]:
    """The CuPy distributions installed (cupy-cuda12x, cupy-cuda13x): one is right."""
    return sorted({d.metadata["Name"] for d in importlib.metadata.distributions()
                   if (d.metadata["Name"] or "").lower().startswith("cupy-")})


def loaded_library(stem: str) -> str | None:
    """The file of the library `stem` (libnvrtc.so) this process has loaded, or None."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode[, path]
        path = fields[5].strip() if len(fields) == 6 else ""
        if Path(path).name.startswith(stem + "."):  # libnvrtc.so.12, not libnvrtc-builtins
            return path
    return None


def _read_headers(facts: Facts, cupy) -> None:
    """The CUDA headers CuPy's compiles get, by CuPy's own search (CuPy 14 refuses every
    compile without them), and their CUDA version."""
    try:
        options = cupy._core.core.assemble_cupy_compiler_options(())
    except AttributeError:  # a CuPy that does not say: not a problem of its own
        return
    except Exception as exc:  # noqa: BLE001 - CuPy's "Failed to find CUDA headers"
        facts.headers_error = _error(exc)
        return
    own = Path(cupy.__file__).parent
    found = [Path(o[2:]) for o in options if o.startswith("-I") and own not in Path(o[2:]).parents]
    if found:
        facts.headers = str(found[0])
        facts.headers_cuda = header_version(found[0])


def header_version(include: Path) -> tuple | None:
    """The CUDA version of the headers in `include` (CUDART_VERSION in cuda_runtime_api.h)."""
    try:
        match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)",
                          (include / "cuda_runtime_api.h").read_text(errors="replace"))
    except OSError:
        return None
    return _cuda(int(match[1])) if match else None


def read_compile(facts: Facts) -> None:
    """The NVRTC `cek compile` and the static report compile with."""
    try:
        from cek import compile as compiler

        facts.compile_nvrtc = f"{_dotted(compiler.nvrtc_version())} ({compiler.nvrtc_provider()})"
        facts.archs = list(compiler.known_archs())
    except Exception as exc:  # noqa: BLE001 - no NVRTC: the error says what to install
        facts.compile_error = _error(exc)


def read_torch(facts: Facts) -> None:
    """torch's version, the CUDA it was built for and the GPUs it sees."""
    if importlib.util.find_spec("torch") is None:
        facts.torch_error = "not installed"
        return
    try:
        import torch

        facts.torch, facts.torch_cuda = torch.__version__, torch.version.cuda
        facts.torch_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception as exc:  # noqa: BLE001 - a torch that cannot load its libraries
        facts.torch_error = f"cannot load: {_error(exc)}"


# -- the machine -------------------------------------------------------------------------------


def environment():
    """(label, text) of each fact of the machine and the Python environment, each yielded as
    soon as it is read: the OS and its C library, the CPU, Python, g++ (the emulator's and the
    CPU path's compiler), each distribution of DISTRIBUTIONS and CuPy's, and the environment
    variables that change what CUDA and CuPy do."""
    libc, libc_version = platform.libc_ver()
    yield "OS", f"{platform.platform()}, {libc or 'libc'} {libc_version or 'version not known'}"
    yield "CPU", f"{cpu_model()}, {os.cpu_count()} cores"
    yield "Python", f"{platform.python_version()} ({platform.python_implementation()}), " \
                    f"{sys.executable}"
    yield "g++", gxx_version()
    for name in (*DISTRIBUTIONS, *cupy_wheels()):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        yield "package", f"{name} {version}"
    for name in ENVIRONMENT_VARIABLES:
        yield name, os.environ.get(name, "(not set)")


def cpu_model() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        return re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)[1].strip()
    except (OSError, TypeError):  # not Linux, or an architecture that names it otherwise
        return platform.processor() or platform.machine()


def gxx_version() -> str:
    """g++'s first line of --version, or why there is none."""
    try:
        done = subprocess.run(["g++", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"not found ({_error(exc)}): the emulator and the CPU path need g++ >= 12"
    return (done.stdout.splitlines() or ["(no version printed)"])[0]


# -- the one real launch -----------------------------------------------------------------------


def run_launches(facts: Facts) -> None:
    """The fused kernel as a training step on the GPU against the CPU path: through cek.torch
    in float32 and bfloat16 where torch sees a GPU, else through CuPy in float32 and float16."""
    via_torch = facts.torch_devices > 0
    for dtype in ("f32", "bf16") if via_torch else ("f32", "f16"):
        what = (f"fused {LAUNCH_ROWS} x {LAUNCH_DIM} {DTYPE_NAMES[dtype]}, "
                f"{'cek.torch' if via_torch else 'CuPy'}")
        try:
            got, want, values = (_torch_step if via_torch else _cupy_step)(dtype)
            detail = compare(got, want, values, dtype)
        except Exception as exc:  # noqa: BLE001 - a launch that fails is a fact to report
            facts.launches.append({"what": what, "ok": False, "detail": f"failed: {_error(exc)}"})
            continue
        facts.launches.append({"what": what, "ok": detail.startswith("matches"), "detail": detail})


def _inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    inputs = cek.check.make_inputs(LAUNCH_ROWS, LAUNCH_DIM)  # labels +-1, 0, 2; a zero row
    return inputs["x1"], inputs["x2"], inputs["y"]


def _cupy_step(dtype: str):
    """(the GPU's mean, dx1, dx2; the CPU path's; x1, x2, y as used) through cek's functions."""
    import cupy

    x1, x2, y = _inputs()
    x1, x2 = (cek.dtypes.from_float(x, dtype) for x in (x1, x2))
    got = cek.cosine_embedding_loss_fused(cupy.asarray(x1), cupy.asarray(x2), cupy.asarray(y),
                                          margin=MARGIN)
    want = cek.cosine_embedding_loss_fused(x1, x2, y, margin=MARGIN)
    return [cupy.asnumpy(v) for v in got], list(want), (x1, x2, y)


def _torch_step(dtype: str):
    """As _cupy_step, through cek.torch: the forward (the fused kernel) and the backward."""
    import torch

    import cek.torch as cek_torch

    x1, x2, y = _inputs()
    kind = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]

    def step(device):
        a, b = (torch.from_numpy(x).to(device, kind).requires_grad_() for x in (x1, x2))
        loss = cek_torch.cosine_embedding_loss(a, b, torch.from_numpy(y).to(device), margin=MARGIN)
        loss.backward()
        return [cek.dtypes.from_float(t.detach().float().cpu().numpy(), dtype)
                for t in (loss, a.grad, b.grad)]

    rounded = [cek.dtypes.from_float(x, dtype) for x in (x1, x2)]  # the values torch holds
    return step("cuda"), step("cpu"), (*rounded, y)


def compare(got, want, values, dtype: str) -> str:
    """Whether the GPU's mean and gradients match the CPU path's within `cek check`'s
    tolerances for `dtype` (the mean is rounded to the dtype once, a "reduced" value), and the
    largest relative difference; or the first value that does not."""
    max_rel, failures = _differences(got, want, values, dtype)
    if failures:
        return "differs from the CPU path: " + "; ".join(failures)
    return f"matches the CPU path (largest relative difference {max_rel:.1e})"


def _differences(got, want, values, dtype: str) -> tuple[float, list[str]]:
    """(the largest relative difference, the values out of `cek check`'s tolerances) of the
    mean and gradients `got` against `want`, for inputs `values` (x1, x2, y)."""
    x1, x2 = (cek.dtypes.to_float64(v, dtype) for v in values[:2])
    y = values[2]
    magnitudes = cek.reference.gradient_magnitudes(np.full(len(y), 1.0 / len(y)), x1, x2, y,
                                                   MARGIN)
    names = ("reduced", "dx1", "dx2")
    got = {n: np.atleast_1d(v) for n, v in zip(names, got)}
    want = {n: np.atleast_1d(cek.dtypes.to_float64(v, dtype)) for n, v in zip(names, want)}
    size = {"reduced": np.ones(1), "dx1": magnitudes[0], "dx2": magnitudes[1]}
    _, max_rel, failures = cek.check.compare(got, want, size, dtype)
    return max_rel, failures


# -- what runs without a driver ----------------------------------------------------------------


def read_what_runs_here(facts: Facts) -> None:
    """On a host without a driver, what cek does there instead, each tried once: the CPU path,
    the emulator and `cek compile` (facts.runs_here)."""
    if not facts.no_driver:
        return
    for what, attempt in (("CPU path", try_cpu_path), ("emulator", try_emulator),
                          ("cek compile", try_compile)):
        try:
            ok, detail = attempt(facts)
        except Exception as exc:  # noqa: BLE001 - said, as what stops it here
            ok, detail = False, _error(exc)
        facts.runs_here.append({"what": what, "ok": ok, "detail": detail})


def try_cpu_path(facts: Facts) -> tuple[bool, str]:
    """The fused step on NumPy arrays (cek's CPU path) against the float64 reference."""
    from cek import cpu_native

    x1, x2, y = _inputs()
    got = cek.cosine_embedding_loss_fused(x1, x2, y, margin=MARGIN)
    rows = len(y)
    want = (cek.reference.forward(x1, x2, y, MARGIN).mean(),
            *cek.reference.backward(np.full(rows, 1.0 / rows), x1, x2, y, MARGIN))
    max_rel, failures = _differences(got, want, (x1, x2, y), "f32")
    if failures:
        return False, "differs from the float64 reference: " + "; ".join(failures)
    why_not = cpu_native.unavailable_reason()
    how = "C++ built with g++" if why_not is None else f"NumPy code: {why_not}"
    return True, (f"{LAUNCH_ROWS} x {LAUNCH_DIM} float32 matches the float64 reference "
                  f"(largest relative difference {max_rel:.1e}; {how})")


def try_emulator(facts: Facts) -> tuple[bool, str]:
    """The fused kernel's exact source on the CPU emulator, as `cek check --device cpu` runs it."""
    results = cek.check.run_cases(cek.check.plan(["fused"], ["f32"], [LAUNCH_DIM]),
                                  cek.check.emulator_launcher(), "cpu-emulator", 7)
    failed = [r for r in results if not r.passed]
    if failed:
        return False, f"the fused kernel differs from the float64 reference: {failed[0].detail}"
    return True, (f"the fused kernel's source matches the float64 reference "
                  f"(cek check --device cpu runs every kernel)")


def try_compile(facts: Facts) -> tuple[bool, str]:
    """The fused kernel compiled by `cek compile`'s NVRTC, for the newest arch it knows up to
    sm_90."""
    if facts.compile_error is not None:
        return False, facts.compile_error
    from cek import compile as compiler
    from cek.kernel import kernel_classes

    archs = [a for a in facts.archs if int(re.match(r"sm_(\d+)", a)[1]) <= 90] or facts.archs
    kernel = kernel_classes()["fused"].for_n_dim(LAUNCH_DIM, "f32")
    result = compiler.compile_kernel(kernel, archs[-1])
    return True, (f"the fused kernel compiles for {archs[-1]}, "
                  f"{result.summary()['registers']} registers")


# -- all of it --------------------------------------------------------------------------------


def diagnose(on_read=None) -> tuple[Facts, list[Problem]]:
    """Every fact, the launch where CuPy reaches a GPU (without a driver, what runs without
    one), and the problems; on_read(what, facts)
    after each reader, so that its facts can be said at once. A reader that fails in a way it
    does not foresee becomes a problem too: doctor never ends in a traceback."""
    facts, unforeseen = Facts(), []
    readers = [("the driver", lambda f: read_driver(f, libcuda())), ("CuPy", read_cupy),
               ("cek compile's NVRTC", read_compile), ("torch", read_torch),
               ("the launch", lambda f: run_launches(f) if f.cupy_devices > 0 else None),
               ("what runs here", read_what_runs_here)]
    for what, read in readers:
        try:
            read(facts)
        except Exception as exc:  # noqa: BLE001 - said, with what it was reading
            unforeseen.append(Problem(f"reading {what} failed: {_error(exc)}",
                                      "report it, with this output"))
        if on_read is not None:
            on_read(what, facts)
    return facts, problems(facts) + unforeseen
