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
the CPU path), 1 when it cannot, 2 for a bad option.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import platform
import re
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
        pass
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


def _extra(driver: tuple | None) -> str:
    """The install line for the driver's CUDA major."""
    if driver is None:
        return "pip install '.[cuda12]' for a CUDA 12.x driver, '.[cuda13]' for 13.x"
    return f"pip install '.[cuda{12 if driver[0] <= 12 else 13}]'"


def _runtime_wheel(major: int) -> str:
    """The wheel of CUDA `major`'s runtime headers: its name changed with CUDA 13."""
    return "nvidia-cuda-runtime-cu12" if major == 12 else "nvidia-cuda-runtime"


def _torch_fix(driver: tuple) -> str:
    return (f"install the torch built for CUDA {driver[0]}.x by the command PyTorch's install "
            f"selector gives, then pip install '.[torch]'")


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
                             f"{_extra(driver)}"))
    if facts.cupy_error is not None:
        found.append(Problem(f"CuPy: {facts.cupy_error}", _extra(driver)))
    else:
        found += _cupy_problems(facts, driver)
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
                             f"{_extra(driver)}"))
    elif facts.gpus and facts.cupy_devices == 0:
        found.append(Problem(f"CuPy sees no GPU ({facts.cupy_device_error or 'none'})",
                             "CUDA_VISIBLE_DEVICES, where set, must name a GPU nvidia-smi "
                             "lists"))
    if facts.nvrtc_error is not None:
        wheel = cek.compile.nvrtc_wheel(cuda or 12)
        found.append(Problem(f"CuPy finds no NVRTC ({facts.nvrtc_error})", f"pip install {wheel}"))
    elif driver is not None and facts.nvrtc is not None and facts.nvrtc[0] > driver[0]:
        file = facts.nvrtc_file or "an unknown file"
        own = (f"pip uninstall {cek.compile.nvrtc_wheel(facts.nvrtc[0])}, then "
               if "-packages" in file else "")
        found.append(Problem(f"CuPy compiles with NVRTC {_dotted(facts.nvrtc)} ({file}), newer "
                             f"than the CUDA {_dotted(driver)} the driver supports: what it "
                             "compiles cannot load", f"{own}{_extra(driver)}"))
    if facts.headers_error is not None:
        found.append(Problem(f"CuPy finds no CUDA headers, so every CuPy compile fails "
                             f"({facts.headers_error})", f"pip install {_runtime_wheel(cuda)}"))
    return found


def _torch_problems(facts: Facts, driver: tuple | None) -> list[Problem]:
    if driver is None or not facts.gpus:
        return []  # no GPU here: a CPU build of torch is the right one
    if facts.torch_error not in (None, "not installed"):
        return [Problem(f"torch: {facts.torch_error}", _torch_fix(driver))]
    if facts.torch is None:
        return []
    if facts.torch_cuda is None:
        return [Problem(f"torch {facts.torch} is a CPU build: cek.torch runs on the CPU",
                        _torch_fix(driver))]
    built = tuple(int(part) for part in facts.torch_cuda.split(".")[:2])
    if built[0] > driver[0]:
        return [Problem(f"torch {facts.torch} is built for CUDA {facts.torch_cuda}, newer than "
                        f"the CUDA {_dotted(driver)} the driver supports: "
                        "torch.cuda.is_available() is False, cek.torch runs on the CPU",
                        _torch_fix(driver))]
    if facts.torch_devices == 0:
        return [Problem(f"torch {facts.torch} sees no GPU", "CUDA_VISIBLE_DEVICES, where set, "
                        "must name a GPU nvidia-smi lists")]
    return []


# -- the report --------------------------------------------------------------------------------


def diagnose() -> tuple[Facts, list[Problem]]:
    """Every fact, the launch where CuPy reaches a GPU, and the problems. A reader that fails in
    a way it does not foresee becomes a problem too: doctor never ends in a traceback."""
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
    return facts, problems(facts) + unforeseen


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def report(facts: Facts, found: list[Problem]) -> list[str]:
    """The facts, the launches and the problems with their fixes, a line each."""
    rows = [("cek", f"{cek.__version__}, Python {platform.python_version()}, "
                    f"{platform.system()} {platform.machine()}"),
            ("driver", _driver_line(facts))]
    rows += [(f"GPU {i}", f"{name}, {arch}, {memory / 2**30:.1f} GiB")
             for i, (name, arch, memory) in enumerate(facts.gpus)]
    rows += [("CuPy", _cupy_line(facts)), ("NVRTC", _nvrtc_line(facts)),
             ("headers", _headers_line(facts)),
             ("cek compile", f"NVRTC {facts.compile_nvrtc}" if facts.compile_nvrtc
              else f"no NVRTC: {facts.compile_error}"),
             ("torch", _torch_line(facts))]
    rows += [("launch", f"{launch['what']}: {launch['detail']}") for launch in facts.launches]
    if facts.cupy_devices == 0:
        rows.append(("launch", "not run: CuPy reaches no GPU"))
    for problem in found:
        rows += [("problem", problem.text), ("  fix", problem.fix)]
    rows.append(("verdict", "the GPU path can run" if not found else
                 f"the GPU path cannot run: {_count(len(found), 'problem')}"))
    width = max(len(name) for name, _ in rows)
    return [f"{name:<{width}}  {text}" for name, text in rows]


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

    The driver and the CUDA it supports, each GPU, the CuPy and NVRTC that compile the kernels
    and where their CUDA headers come from, the NVRTC of `cek compile`, torch and its CUDA; where
    CuPy reaches a GPU, one launch of the fused kernel against the CPU path. Exit 0 when the GPU
    path can run, 1 when it cannot.

    \b
    Example:
      cek doctor > doctor.txt     # run after installing; paste it into a bug report
    """
    facts, found = diagnose()
    if as_json:
        click.echo(json.dumps({"facts": asdict(facts), "problems": [asdict(p) for p in found]},
                              indent=2))
    else:
        click.echo("\n".join(report(facts, found)))
    if found:
        raise click.ClickException(f"the GPU path cannot run here: "
                                   f"{_count(len(found), 'problem')}, each with its fix above")
