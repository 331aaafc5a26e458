"""`cek doctor`: what the GPU path runs with on this machine, what stops it, and how to fix it.

The one command to run on a GPU host after installing, and to paste into a bug report. Each fact
is read on its own, and whatever reading it raises becomes part of the fact ("CuPy: cannot
load: ...") instead of a traceback: the environments that need this command most are the
broken ones. The driver is asked through its own library (libcuda, by ctypes), not through
CuPy, so that a machine without CuPy learns which extra to install.

CUDA's compatibility rule behind the problems: a driver runs code built by a toolkit of its own
CUDA major or an older one; a newer minor of the same major is fine for CuPy, which compiles
to SASS (cubin), not PTX. So an NVRTC, a CuPy or a torch built for a newer major than the
driver supports cannot run there.

Exit 0 when the GPU path can run (no problem, and one real launch of the fused kernel matched
the CPU path), 1 when it cannot, 2 for a bad option, 3 when the CuPy path runs on the GPU and
cek.torch on the CPU only (TORCH_ON_CPU).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click
import numpy as np

import cek

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
# The widest label: each line is printed as it is known, so the column cannot wait for them all.
LABEL_WIDTH = max(map(len, ENVIRONMENT_VARIABLES))
# The exit status of a host whose CuPy path runs on the GPU while its torch cannot reach the
# GPU: not 0, which says everything runs there, nor 1, which says nothing does.
TORCH_ON_CPU = 3
# What cek's extras install (pyproject.toml; tests/test_packaging.py holds them equal): a fix
# names the packages themselves, which install the same with cek installed or in a checkout.
EXTRAS = {12: ("cupy-cuda12x>=14.0,<15", "nvidia-cuda-nvrtc-cu12>=12.0,<13",
               "nvidia-cuda-runtime-cu12>=12.0,<13"),
          13: ("cupy-cuda13x>=14.0,<15", "nvidia-cuda-nvrtc>=13.0.88,<13.6",
               "nvidia-cuda-runtime>=13.0.48,<13.6")}


@dataclass
class Facts:
    """What doctor found. A None value with its *_error set: reading it failed, and why."""

    driver: str | None = None          # the kernel module's version, 550.54.15
    driver_cuda: tuple | None = None   # the newest CUDA the driver runs, (12, 4)
    driver_error: str | None = None    # no driver, or no GPU it can list
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


@dataclass
class Problem:
    text: str
    fix: str
    torch_only: bool = False  # cek.torch runs on the CPU for it; the CuPy path is untouched


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0]


def _cuda(version: int) -> tuple[int, int]:
    return version // 1000, version % 1000 // 10  # 12040: (12, 4)


def _dotted(version) -> str:
    return ".".join(map(str, version))


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
    x1, x2 = (cek.dtypes.to_float64(v, dtype) for v in values[:2])
    y = values[2]
    magnitudes = cek.reference.gradient_magnitudes(np.full(len(y), 1.0 / len(y)), x1, x2, y,
                                                   MARGIN)
    names = ("reduced", "dx1", "dx2")
    got = {n: np.atleast_1d(v) for n, v in zip(names, got)}
    want = {n: np.atleast_1d(cek.dtypes.to_float64(v, dtype)) for n, v in zip(names, want)}
    size = {"reduced": np.ones(1), "dx1": magnitudes[0], "dx2": magnitudes[1]}
    _, max_rel, failures = cek.check.compare(got, want, size, dtype)
    if failures:
        return "differs from the CPU path: " + "; ".join(failures)
    return f"matches the CPU path (largest relative difference {max_rel:.1e})"


# -- the problems and their fixes --------------------------------------------------------------


def _install(driver: tuple | None) -> str:
    """The install line of the GPU path for the driver's CUDA major."""
    if driver is None:
        return f"{_pip(12)} for a CUDA 12.x driver, {_pip(13)} for 13.x"
    return _pip(12 if driver[0] <= 12 else 13)


def _pip(major: int) -> str:
    return f"pip install {' '.join(repr(r) for r in EXTRAS[major])} (cek's cuda{major} extra)"


def _runtime_wheel(major: int) -> str:
    """The wheel of CUDA `major`'s runtime headers: its name changed with CUDA 13."""
    return "nvidia-cuda-runtime-cu12" if major == 12 else "nvidia-cuda-runtime"


def _torch_install(major: int) -> str:
    # pip keeps an installed torch whatever CUDA it was built for: the old one goes first.
    return (f"install torch by the command PyTorch's install selector gives for CUDA {major}.x "
            "(its own index: torch's default build is made for CUDA 13)")


def _torch_fix(driver: tuple) -> str:
    return f"pip uninstall -y torch, then {_torch_install(driver[0])}"


def required_by(name: str) -> list[str]:
    """The installed distributions whose own requirements (not an extra's) name `name`: an
    uninstall of it breaks them."""
    wanted = _normal(name)
    return sorted({d.metadata["Name"] for d in importlib.metadata.distributions()
                   for requirement in d.requires or ()
                   if "extra ==" not in requirement
                   and _normal(re.match(r"[\w.-]*", requirement)[0]) == wanted})


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def ptx_mode() -> bool:
    """Whether CuPy compiles to PTX, which the driver compiles for the GPU, in place of SASS:
    CUPY_COMPILE_WITH_PTX set to the integer 1, as CuPy reads it."""
    try:
        return int(os.environ.get("CUPY_COMPILE_WITH_PTX") or 0) == 1
    except ValueError:
        return False


def problems(facts: Facts) -> list[Problem]:
    """Each thing that stops the GPU path here, with its fix, in the order to fix them."""
    found: list[Problem] = []
    driver = facts.driver_cuda
    if driver is None:
        found.append(Problem(facts.driver_error or "no NVIDIA driver",
                             "install the NVIDIA driver: nvidia-smi must list the GPU (without "
                             "one, `cek check --device cpu` and `cek compile` run here)"))
    elif not facts.gpus:
        found.append(Problem(facts.driver_error or "the NVIDIA driver sees no GPU",
                             "nvidia-smi must list the GPU; a container must be started with "
                             "it (docker run --gpus all)"))
    elif driver[0] < 12:
        found.append(Problem(f"the driver supports CUDA {_dotted(driver)}, older than the CUDA "
                             "12 CuPy 14 needs", "install a driver of CUDA 12 or newer"))
    if len(facts.cupy_wheels) > 1:
        found.append(Problem(f"{len(facts.cupy_wheels)} CuPy wheels share one package directory "
                             f"({', '.join(facts.cupy_wheels)})",
                             f"pip uninstall {' '.join(facts.cupy_wheels)}, then "
                             f"{_install(driver)}"))
    if facts.cupy_error is not None:
        found.append(Problem(f"CuPy: {facts.cupy_error}", _install(driver)))
    else:
        found += _cupy_problems(facts, driver) + _arch_problems(facts)
    found += _torch_problems(facts, driver)
    found += [Problem(f"the launch of {launch['what']} {launch['detail']}",
                      "report it, with this output") for launch in facts.launches
              if not launch["ok"]]
    return found


def _cupy_problems(facts: Facts, driver: tuple | None) -> list[Problem]:
    found = []
    cuda = (facts.cupy_cuda or (0, 0))[0]
    if driver is not None and cuda > driver[0]:
        found.append(Problem(f"CuPy is built for CUDA {_dotted(facts.cupy_cuda)}, newer than "
                             f"the CUDA {_dotted(driver)} the driver supports",
                             f"pip uninstall {' '.join(facts.cupy_wheels) or 'cupy'}, then "
                             f"{_install(driver)}"))
    elif facts.gpus and facts.cupy_devices == 0:
        found.append(Problem(f"CuPy sees no GPU ({facts.cupy_device_error or 'none'})",
                             "CUDA_VISIBLE_DEVICES, where set, must name a GPU nvidia-smi "
                             "lists"))
    if facts.nvrtc_error is not None:
        wheel = cek.compile.nvrtc_wheel(cuda or 12)
        found.append(Problem(f"CuPy finds no NVRTC ({facts.nvrtc_error})", f"pip install {wheel}"))
    elif driver is not None and facts.nvrtc is not None and facts.nvrtc[0] > driver[0]:
        found.append(_nvrtc_newer_than_the_driver(facts, driver))
    elif driver is not None and facts.nvrtc is not None and ptx_mode() \
            and tuple(facts.nvrtc) > tuple(driver):
        wheel = cek.compile.nvrtc_wheel(driver[0])
        found.append(Problem(
            f"CUPY_COMPILE_WITH_PTX=1: CuPy hands the driver PTX of NVRTC "
            f"{_dotted(facts.nvrtc)}, newer than the CUDA {_dotted(driver)} the driver "
            "supports, which cannot load it",
            f"unset CUPY_COMPILE_WITH_PTX (CuPy then compiles SASS, which a driver of CUDA "
            f"{driver[0]}.x loads from any NVRTC {driver[0]}.x), or pip install "
            f"'{wheel}<{driver[0]}.{driver[1] + 1}'"))
    if facts.headers_error is not None:
        found.append(Problem(f"CuPy finds no CUDA headers, so every CuPy compile fails "
                             f"({facts.headers_error})", f"pip install {_runtime_wheel(cuda)}"))
    return found


def _nvrtc_newer_than_the_driver(facts: Facts, driver: tuple) -> Problem:
    """CuPy loads the newest NVRTC it finds: one of another wheel (torch's) is loaded in place
    of its own. Where torch pins that wheel, uninstalling the wheel alone would break torch."""
    file = facts.nvrtc_file or "an unknown file"
    text = (f"CuPy compiles with NVRTC {_dotted(facts.nvrtc)} ({file}), newer than the CUDA "
            f"{_dotted(driver)} the driver supports: what it compiles cannot load")
    if "-packages" not in file:
        return Problem(text, _install(driver))
    wheel = cek.compile.nvrtc_wheel(facts.nvrtc[0])
    if "torch" in required_by(wheel):
        return Problem(f"{text} ({_torch_named(facts)} pins {wheel})",
                       f"pip uninstall -y torch {wheel}, then {_torch_install(driver[0])}")
    return Problem(text, f"pip uninstall -y {wheel}, then {_install(driver)}")


def _arch_problems(facts: Facts) -> list[Problem]:
    """A GPU older than the oldest arch cek compiles for, or newer than its NVRTC knows: CuPy
    compiles SASS for the GPU's arch or, where the NVRTC does not know it, the newest it knows,
    and SASS loads only on GPUs of its own major (sm_90's not on sm_100); in PTX mode the driver
    compiles for the GPU instead."""
    if not facts.archs or facts.nvrtc is None:
        return []
    known = sorted(_arch_number(arch) for arch in facts.archs)
    nvrtc = _dotted(facts.nvrtc)
    gpus: dict[str, list] = {}
    for index, (name, arch, _) in enumerate(facts.gpus):
        gpus.setdefault(arch, []).append(f"{index} ({name})")
    found = []
    for arch, which in gpus.items():
        number, gpu = _arch_number(arch), f"GPU {', '.join(which)} is {arch}"
        if number < known[0]:
            found.append(Problem(f"{gpu}, older than sm_{known[0]}, the oldest arch cek compiles "
                                 f"for with NVRTC {nvrtc}", _below_the_floor_fix(facts, number)))
        elif number > known[-1] and number // 10 != known[-1] // 10 and not ptx_mode():
            found.append(Problem(f"{gpu}, newer than NVRTC {nvrtc} knows: CuPy compiles for "
                                 f"sm_{known[-1]}, the newest it knows, which an {arch} GPU "
                                 "cannot load", _newer_nvrtc_fix(facts)))
    return found


def _arch_number(arch: str) -> int:
    return int(re.match(r"sm_(\d+)", arch)[1])  # sm_90a: 90


def _below_the_floor_fix(facts: Facts, arch: int) -> str:
    oldest = cek.compile.OLDEST_ARCH
    if arch < oldest:
        return (f"none for this GPU: cek's GPU path needs sm_{oldest} or newer; the CPU path "
                "runs here (cek check --device cpu, cek.torch on CPU tensors)")
    wheels = " ".join([*facts.cupy_wheels, cek.compile.nvrtc_wheel(13), _runtime_wheel(13)])
    return (f"pip uninstall -y {wheels}, then {_pip(12)}: NVRTC 12 compiles for "
            f"sm_{oldest}, and a 13.x driver runs what it compiles")


def _newer_nvrtc_fix(facts: Facts) -> str:
    major = facts.nvrtc[0]
    wheel = cek.compile.nvrtc_wheel(major)
    if "torch" in required_by(wheel):  # torch pins its NVRTC: a newer one comes with a torch
        return (f"pip uninstall -y torch, then install torch by the command PyTorch's install "
                f"selector gives for its newest CUDA {major}.x, whose NVRTC knows the newest "
                f"archs ({_torch_named(facts)} pins {wheel})")
    return f"pip install -U {wheel}: the newest NVRTC {major}.x knows the newest archs"


def _torch_named(facts: Facts) -> str:
    return f"torch {facts.torch}" if facts.torch else "torch"


def _torch_problems(facts: Facts, driver: tuple | None) -> list[Problem]:
    if driver is None or not facts.gpus:
        return []  # no GPU here: a CPU build of torch is the right one
    if facts.torch_error not in (None, "not installed"):
        return [Problem(f"torch: {facts.torch_error}", _torch_fix(driver))]
    if facts.torch is None:
        return []
    if facts.torch_cuda is None:
        return [Problem(f"torch {facts.torch} is a CPU build: cek.torch runs on the CPU",
                        _torch_fix(driver), torch_only=True)]
    built = tuple(int(part) for part in facts.torch_cuda.split(".")[:2])
    if built[0] > driver[0]:
        return [Problem(f"torch {facts.torch} is built for CUDA {facts.torch_cuda}, newer than "
                        f"the CUDA {_dotted(driver)} the driver supports: "
                        "torch.cuda.is_available() is False, cek.torch runs on the CPU",
                        _torch_fix(driver), torch_only=True)]
    if facts.torch_devices == 0:
        return [Problem(f"torch {facts.torch} sees no GPU", "CUDA_VISIBLE_DEVICES, where set, "
                        "must name a GPU nvidia-smi lists")]
    return []


def exit_status(facts: Facts, found: list[Problem]) -> int:
    """0: the GPU path runs; TORCH_ON_CPU: the CuPy path ran on the GPU and matched, and
    only torch is wrong (cek.torch runs on the CPU); 1: the GPU path cannot run."""
    if not found:
        return 0
    if all(p.torch_only for p in found) and facts.launches \
            and all(launch["ok"] for launch in facts.launches):
        return TORCH_ON_CPU
    return 1


# -- the report --------------------------------------------------------------------------------


def diagnose(on_read=None) -> tuple[Facts, list[Problem]]:
    """Every fact, the launch where CuPy reaches a GPU, and the problems; on_read(what, facts)
    after each reader, so that its facts can be said at once. A reader that fails in a way it
    does not foresee becomes a problem too: doctor never ends in a traceback."""
    facts, unforeseen = Facts(), []
    readers = [("the driver", lambda f: read_driver(f, libcuda())), ("CuPy", read_cupy),
               ("cek compile's NVRTC", read_compile), ("torch", read_torch),
               ("the launch", lambda f: run_launches(f) if f.cupy_devices > 0 else None)]
    for what, read in readers:
        try:
            read(facts)
        except Exception as exc:  # noqa: BLE001 - said, with what it was reading
            unforeseen.append(Problem(f"reading {what} failed: {_error(exc)}",
                                      "report it, with this output"))
        if on_read is not None:
            on_read(what, facts)
    return facts, problems(facts) + unforeseen


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def rows_of(what: str, facts: Facts) -> list[tuple[str, str]]:
    """(label, text) of the lines a reader's facts make (`what`: its name in diagnose)."""
    if what == "the driver":
        return [("driver", _driver_line(facts))] + [
            (f"GPU {i}", f"{name}, {arch}, {memory / 2**30:.1f} GiB")
            for i, (name, arch, memory) in enumerate(facts.gpus)]
    if what == "CuPy":
        return [("CuPy", _cupy_line(facts)), ("NVRTC", _nvrtc_line(facts)),
                ("headers", _headers_line(facts))]
    if what == "cek compile's NVRTC":
        if not facts.compile_nvrtc:
            return [("cek compile", f"no NVRTC: {facts.compile_error}")]
        return [("cek compile", f"NVRTC {facts.compile_nvrtc}"),
                ("archs", ", ".join(facts.archs) or "none known")]
    if what == "torch":
        return [("torch", _torch_line(facts))]
    rows = [("launch", f"{launch['what']}: {launch['detail']}") for launch in facts.launches]
    return rows if facts.cupy_devices else [*rows, ("launch", "not run: CuPy reaches no GPU")]


def verdict(facts: Facts, found: list[Problem]) -> str:
    status = exit_status(facts, found)
    if status == 0:
        return "the GPU path can run"
    if status == TORCH_ON_CPU:
        return (f"the CuPy path runs on the GPU; cek.torch runs on the CPU: "
                f"{_count(len(found), 'problem')}")
    return f"the GPU path cannot run: {_count(len(found), 'problem')}"


def verdict_rows(facts: Facts, found: list[Problem]) -> list[tuple[str, str]]:
    rows = []
    for problem in found:
        rows += [("problem", problem.text), ("  fix", problem.fix)]
    return [*rows, ("verdict", verdict(facts, found))]


def first_row() -> tuple[str, str]:
    return ("cek", f"{cek.__version__}, Python {platform.python_version()}, "
                   f"{platform.system()} {platform.machine()}")


def line(label: str, text: str) -> str:
    return f"{label:<{LABEL_WIDTH}}  {text}"


def report(facts: Facts, found: list[Problem]) -> list[str]:
    """The facts, the launches and the problems with their fixes, a line each (the machine's
    facts are doctor_command's, said first)."""
    rows = [first_row()]
    for what in ("the driver", "CuPy", "cek compile's NVRTC", "torch", "the launch"):
        rows += rows_of(what, facts)
    return [line(*row) for row in rows + verdict_rows(facts, found)]


def _driver_line(facts: Facts) -> str:
    if facts.driver_cuda is None:
        return facts.driver_error or "not found"
    line = f"{facts.driver or 'version not known'}, supports CUDA {_dotted(facts.driver_cuda)}"
    return line if facts.gpus else f"{line}; {facts.driver_error}"


def _cupy_line(facts: Facts) -> str:
    if facts.cupy_error is not None:
        return facts.cupy_error
    sees = (_count(facts.cupy_devices, "GPU") if facts.cupy_devices
            else f"no GPU ({facts.cupy_device_error})")
    return f"{facts.cupy}, built for CUDA {_dotted(facts.cupy_cuda or ('?',))}, sees {sees}"


def _nvrtc_line(facts: Facts) -> str:
    if facts.cupy_error is not None:
        return "- (no CuPy)"
    if facts.nvrtc_error is not None:
        return f"none found ({facts.nvrtc_error})"
    return f"{_dotted(facts.nvrtc)}, CuPy's: {facts.nvrtc_file or 'file not known'}"


def _headers_line(facts: Facts) -> str:
    if facts.cupy_error is not None:
        return "- (no CuPy)"
    if facts.headers_error is not None:
        return f"none found ({facts.headers_error})"
    if facts.headers is None:
        return "not known (this CuPy does not say)"
    version = _dotted(facts.headers_cuda) if facts.headers_cuda else "version not known"
    return f"CUDA {version}: {facts.headers}"


def _torch_line(facts: Facts) -> str:
    if facts.torch is None:
        return facts.torch_error or "not installed"
    built = f"built for CUDA {facts.torch_cuda}" if facts.torch_cuda else "a CPU build"
    return f"{facts.torch}, {built}, sees {_count(facts.torch_devices, 'GPU')}"


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the facts and problems as JSON.")
def doctor_command(as_json: bool) -> None:
    """What the GPU path runs with here, what stops it, and the fix of each problem.

    The machine (OS and glibc, CPU, Python, g++, the exact versions of numpy, click, CuPy, the
    NVRTC and CUDA runtime wheels, cuda-bindings and torch, CUDA_VISIBLE_DEVICES and
    CUPY_COMPILE_WITH_PTX); the driver and the CUDA it supports, each GPU, the CuPy and NVRTC
    that compile the kernels and where their CUDA headers come from, the NVRTC of `cek compile`,
    torch and its CUDA; where CuPy reaches a GPU, one launch of the fused kernel against the CPU
    path. Each line is printed as soon as it is known. Exit 0 when the GPU path can run, 1 when
    it cannot, 3 when the CuPy path runs on the GPU but torch cannot reach it (a CPU build, or
    one built for a newer CUDA than the driver's): cek.torch runs on the CPU.

    \b
    Example:
      cek doctor > doctor.txt     # run after installing; paste it into a bug report
    """
    if as_json:
        machine = dict(_safely(environment))
        facts, found = diagnose()
        click.echo(json.dumps({"environment": machine, "facts": asdict(facts),
                               "problems": [asdict(p) for p in found]}, indent=2))
    else:  # each line as soon as it is known: a run cut short still says what it read
        click.echo(line(*first_row()))
        for row in _safely(environment):
            click.echo(line(*row))
        facts, found = diagnose(lambda what, facts: [click.echo(line(*row))
                                                     for row in rows_of(what, facts)])
        for row in verdict_rows(facts, found):
            click.echo(line(*row))
    status = exit_status(facts, found)
    if status == TORCH_ON_CPU:
        click.echo(f"Error: cek.torch runs on the CPU here, the CuPy path on the GPU: "
                   f"{_count(len(found), 'problem')}, each with its fix above", err=True)
        raise click.exceptions.Exit(TORCH_ON_CPU)
    if status:
        raise click.ClickException(f"the GPU path cannot run here: "
                                   f"{_count(len(found), 'problem')}, each with its fix above")


def _safely(rows):
    """The rows of the generator function `rows`, and a line saying why, should it fail."""
    try:
        yield from rows()
    except Exception as exc:  # noqa: BLE001 - doctor never ends in a traceback
        yield "machine", f"reading it failed: {_error(exc)}"
