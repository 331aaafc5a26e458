"""`cek doctor`'s problems: what stops the GPU path on this host, each with its fix, in the
order to fix them, and the exit status they make (cek/doctor.py reads the facts they come from).

CUDA's compatibility rule behind them: a driver runs code built by a toolkit of its own CUDA
major or an older one; a newer minor of the same major is fine for CuPy, which compiles to SASS
(cubin), not PTX. So an NVRTC, a CuPy or a torch built for a newer major than the driver
supports cannot run there.

A host without a driver has no GPU path to fix: its problems are those of what runs there
without one (the CPU path, the emulator, `cek compile`), whose fixes install no GPU package.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cek

if TYPE_CHECKING:
    from cek.doctor import Facts

# The exit status of a host whose CuPy path runs on the GPU while its torch cannot reach the
# GPU: not 0, which says everything runs there, nor 1, which says nothing does.
TORCH_ON_CPU = 3
# The exit status of a host without an NVIDIA driver where the CPU path, the emulator and
# `cek compile` work: what such a host is installed for runs, and the GPU path cannot.
NO_DRIVER = 4
# What cek's extras install (pyproject.toml; tests/test_packaging.py holds them equal): a fix
# names the packages themselves, which install the same with cek installed or in a checkout.
EXTRAS = {12: ("cupy-cuda12x>=14.0,<15", "nvidia-cuda-nvrtc-cu12>=12.0,<13",
               "nvidia-cuda-runtime-cu12>=12.0,<13"),
          13: ("cupy-cuda13x>=14.0,<15", "nvidia-cuda-nvrtc>=13.0.88,<13.6",
               "nvidia-cuda-runtime>=13.0.48,<13.6")}
# The fix of each check of a host without a driver (cek.doctor.read_what_runs_here).
RUNS_HERE_FIXES = {
    "CPU path": "report it, with this output",
    "emulator": "install g++ 12 or newer: the emulator builds the kernels' source with it",
    "cek compile": "pip install '.[nvrtc]' from a checkout: cek's own NVRTC, no GPU package",
}


@dataclass
class Problem:
    text: str
    fix: str
    torch_only: bool = False  # cek.torch runs on the CPU for it; the CuPy path is untouched


def _dotted(version) -> str:
    return ".".join(map(str, version))


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
    """Each thing that stops the GPU path here, with its fix, in the order to fix them; on a
    host without a driver, each thing that fails of what runs without one (no GPU package is
    a fix there)."""
    if facts.no_driver:
        return [Problem(f"{run['what']} does not run here: {run['detail']}",
                        RUNS_HERE_FIXES[run["what"]]) for run in facts.runs_here if not run["ok"]]
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
    only torch is wrong (cek.torch runs on the CPU); NO_DRIVER: no driver here, and what runs
    without one works; 1: the GPU path cannot run on this GPU host, or what runs without a
    driver fails."""
    if facts.no_driver:
        return 1 if found else NO_DRIVER
    if not found:
        return 0
    if all(p.torch_only for p in found) and facts.launches \
            and all(launch["ok"] for launch in facts.launches):
        return TORCH_ON_CPU
    return 1
