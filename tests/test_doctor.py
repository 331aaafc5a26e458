"""cpu tier: `cek doctor` on every environment a user can have, without a GPU: the driver's
library (libcuda), CuPy and torch are stood in for, one case each. Every case ends in a report,
its problems each with a fix, and exit 0, 1, 3 or 4: never a traceback. Without a driver, the
checks of what runs there (the CPU path, the emulator, cek compile) are stood in for too; one
test runs them for real. The launch it runs where a
GPU is usable runs here on the CuPy stand-in with the emulator (emulator tier)."""

import importlib.machinery
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

from cek import doctor, doctor_fixes, doctor_report

H100 = ("NVIDIA H100 80GB HBM3", 9, 0, 85_520_809_984)
B200 = ("NVIDIA B200", 10, 0, 191_514_247_168)
RTX_5090 = ("NVIDIA GeForce RTX 5090", 12, 0, 34_190_917_632)
V100 = ("Tesla V100-SXM2-16GB", 7, 0, 17_059_545_088)
P100 = ("Tesla P100-PCIE-16GB", 6, 0, 17_071_734_784)
# What cek compiles for with each NVRTC (its nvrtcGetSupportedArchs from sm_70 on).
NVRTC_12_6_ARCHS = ["sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90"]
NVRTC_12_9_ARCHS = [*NVRTC_12_6_ARCHS, "sm_100", "sm_101", "sm_103", "sm_120", "sm_121"]
NVRTC_13_0_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100",
                    "sm_103", "sm_110", "sm_120", "sm_121"]
CUDA12_LINE = ("pip install 'cupy-cuda12x>=14.0,<15' 'nvidia-cuda-nvrtc-cu12>=12.0,<13' "
               "'nvidia-cuda-runtime-cu12>=12.0,<13' (cek's cuda12 extra)")
CUDA13_LINE = ("pip install 'cupy-cuda13x>=14.0,<15' 'nvidia-cuda-nvrtc>=13.0.88,<13.6' "
               "'nvidia-cuda-runtime>=13.0.48,<13.6' (cek's cuda13 extra)")
INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver, CuPy's status without a driver
# The checks of a host without a driver, by the name doctor reports each under.
RUNS_HERE = {"CPU path": "try_cpu_path", "emulator": "try_emulator", "cek compile": "try_compile"}
NO_DRIVER_VERDICT = ("no NVIDIA driver: the GPU path cannot run here; the CPU path, the "
                     "emulator and cek compile run")


class Libcuda:
    """The driver's library as ctypes sees it: functions that write through byref pointers and
    return a CUresult. `cuda`: the version cuDriverGetVersion gives (12040: 12.4); `init`: what
    cuInit returns (100: CUDA_ERROR_NO_DEVICE); `gpus`: (name, cc major, cc minor, bytes)."""

    def __init__(self, cuda=12040, gpus=(H100,), init=0):
        self.cuda, self.gpus, self.init = cuda, list(gpus), init

    def cuDriverGetVersion(self, version):
        version._obj.value = self.cuda
        return 0

    def cuInit(self, flags):
        return self.init

    def cuDeviceGetCount(self, count):
        count._obj.value = len(self.gpus)
        return 0

    def cuDeviceGet(self, device, index):
        device._obj.value = index
        return 0

    def cuDeviceGetName(self, name, size, device):
        name.value = self.gpus[device.value][0].encode()
        return 0

    def cuDeviceGetAttribute(self, value, attribute, device):
        value._obj.value = self.gpus[device.value][{75: 1, 76: 2}[attribute]]
        return 0

    def cuDeviceTotalMem_v2(self, memory, device):
        memory._obj.value = self.gpus[device.value][3]
        return 0


class CUDARuntimeError(RuntimeError):
    def __init__(self, status):
        super().__init__(f"CUDA error {status}")
        self.status = status


def _cupy(cuda=12090, devices=1, driver=12040, nvrtc=(12, 9), headers=True):
    """A cupy module: built for CUDA `cuda`, seeing `devices` GPUs (None: getDeviceCount fails
    as without a driver), compiling with NVRTC `nvrtc` (None: no libnvrtc found), finding the
    CUDA headers of its own major or (headers=False) refusing every compile for want of them."""

    def device_count():
        if devices is None:
            raise CUDARuntimeError(INSUFFICIENT_DRIVER)
        return devices

    def nvrtc_version():
        if nvrtc is None:
            raise OSError('Failure finding "libnvrtc.so.13 or libnvrtc.so.12"')
        return nvrtc

    def compiler_options(options):
        if not headers:
            raise RuntimeError("Failed to find CUDA headers. Please install CUDA toolkit "
                               "headers (e.g., pip install cupy-cuda12x[ctk]) or specify "
                               "CUDA_PATH environment variable.")
        return ("-I/site/cupy/_core/include", "--std=c++17", "-I/site/nvidia/cuda_runtime/include")

    runtime = types.SimpleNamespace(runtimeGetVersion=lambda: cuda, getDeviceCount=device_count,
                                    driverGetVersion=lambda: driver)
    return types.SimpleNamespace(
        __version__="14.2.0", __file__="/site/cupy/__init__.py",
        cuda=types.SimpleNamespace(runtime=runtime,
                                   nvrtc=types.SimpleNamespace(getVersion=nvrtc_version)),
        _core=types.SimpleNamespace(core=types.SimpleNamespace(
            assemble_cupy_compiler_options=compiler_options)))


def _torch(version="2.13.0+cu126", cuda="12.6", devices=1):
    torch = types.ModuleType("torch")
    torch.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    torch.__version__ = version
    torch.version = types.SimpleNamespace(cuda=cuda)
    torch.cuda = types.SimpleNamespace(is_available=lambda: devices > 0,
                                       device_count=lambda: devices)
    return torch


class _Unloadable(types.ModuleType):
    """A module that imports but fails on first use, as a torch missing a CUDA library does."""

    def __getattr__(self, name):
        raise OSError("libcudnn.so.9: cannot open shared object file: No such file or directory")


class _RefuseImport:
    """A finder that makes `import name` fail as a CuPy missing its CUDA libraries does."""

    def __init__(self, name, error):
        self.name, self.error = name, error

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name:
            raise self.error
        return None


@pytest.fixture
def machine(monkeypatch):
    """Set up a machine: machine(libcuda=..., cupy=..., torch=..., wheels=[...]); None for a
    piece that is not installed. Launches are recorded, not run."""

    def setup(libcuda=None, cupy=None, torch=None, wheels=(), cupy_error=None,
              archs=NVRTC_12_9_ARCHS, pinned=None, runs_here=None):
        monkeypatch.setattr(doctor, "libcuda", lambda: libcuda)
        # pinned: {wheel: [distributions whose own requirements name it]}
        monkeypatch.setattr(doctor_fixes, "required_by",
                            lambda name: (pinned or {}).get(name, []))
        # runs_here: {"CPU path" | "emulator" | "cek compile": its failure}; the rest work
        for what, name in RUNS_HERE.items():
            error = (runs_here or {}).get(what)
            monkeypatch.setattr(doctor, name, lambda facts, error=error, what=what: (
                (False, error) if error else (True, f"{what} works")))
        monkeypatch.setattr(doctor, "libnvml", lambda: None)
        monkeypatch.setattr(doctor, "DRIVER_VERSION_FILE", doctor.Path("/nonexistent"))
        monkeypatch.setattr(doctor, "cupy_wheels", lambda: list(wheels))
        monkeypatch.setattr(doctor, "loaded_library", lambda stem: None)
        if cupy_error is not None:
            monkeypatch.delitem(sys.modules, "cupy", raising=False)
            monkeypatch.setattr(sys, "meta_path", [_RefuseImport("cupy", cupy_error),
                                                   *sys.meta_path])
        else:
            monkeypatch.setitem(sys.modules, "cupy", cupy)
        monkeypatch.setitem(sys.modules, "torch", torch)
        from cek import compile as compiler  # cek compile's NVRTC: the real one here

        monkeypatch.setattr(compiler, "nvrtc_version", lambda: (12, 9))
        monkeypatch.setattr(compiler, "nvrtc_provider", lambda: "CuPy's")
        monkeypatch.setattr(compiler, "known_archs", lambda: archs)

    return setup


def _doctor(*args):
    """`cek doctor`: its result, having checked that it ended as a command must."""
    result = CliRunner().invoke(doctor_report.doctor_command, list(args), prog_name="cek doctor")
    assert result.exit_code in (0, 1, 3, 4), result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.stdout + result.stderr
    return result


def _rows(result) -> list[tuple[str, str]]:
    """(label, text) of each line of the report: the text starts in one column for all."""
    lines = result.stdout.splitlines()
    start = len(lines[0]) - len(lines[0][len("cek"):].lstrip())
    return [(line[:start].strip(), line[start:]) for line in lines]


def _lines(result, name):
    return [text for label, text in _rows(result) if label == name]


def _problems(result) -> list[tuple[str, str]]:
    rows = _rows(result)
    return [(text, rows[i + 1][1]) for i, (label, text) in enumerate(rows) if label == "problem"]


def _exits_1_saying(result, count):
    assert result.exit_code == 1
    word = "problem" if count == 1 else "problems"
    assert result.stderr == (f"Error: the GPU path cannot run here: {count} {word}, each with its "
                             "fix above\n")


def _says_what_runs_here(result):
    """A host without a driver: the report says so, names what runs there, recommends no GPU
    package, and exits NO_DRIVER (4), not 1 (the work failed), with nothing on stderr."""
    assert _lines(result, "driver") == ["no NVIDIA driver (libcuda.so.1 is not installed)"]
    assert _lines(result, "launch") == ["not run: no NVIDIA driver"]
    assert _lines(result, "runs here") == [f"{what}: {what} works" for what in RUNS_HERE]
    assert _problems(result) == []
    assert _lines(result, "verdict") == [NO_DRIVER_VERDICT]
    assert "pip install" not in result.stdout
    assert result.exit_code == 4 and result.stderr == ""


def test_no_driver_no_cupy_no_torch(machine):
    """The README's no-GPU install (`pip install '.[nvrtc]'`): no driver, no CuPy. What it is
    for runs, and doctor says so; it recommends neither CuPy nor a GPU package."""
    machine(libcuda=None, cupy=None, torch=None)
    result = _doctor()
    assert _lines(result, "CuPy") == ["not installed"]
    assert _lines(result, "torch") == ["not installed"]
    assert _lines(result, "cek compile") == ["NVRTC 12.9 (CuPy's)"]
    _says_what_runs_here(result)


def test_no_driver_with_a_cpu_build_of_torch(machine):
    """The nvrtc install beside torch's CPU build: cek.torch runs on the CPU, which is what a
    host without a GPU has; no problem, no torch to install."""
    machine(libcuda=None, cupy=None, torch=_torch("2.13.0+cpu", None, devices=0))
    result = _doctor()
    assert _lines(result, "torch") == ["2.13.0+cpu, a CPU build, sees 0 GPUs"]
    _says_what_runs_here(result)


def test_no_driver_where_what_runs_here_fails_names_no_gpu_package(machine):
    machine(libcuda=None, cupy=None, torch=None,
            runs_here={"emulator": "RuntimeError: g++ not found",
                       "cek compile": "no NVRTC: pip install '.[nvrtc]'"})
    result = _doctor()
    assert _problems(result) == [
        ("emulator does not run here: RuntimeError: g++ not found",
         "install g++ 12 or newer: the emulator builds the kernels' source with it"),
        ("cek compile does not run here: no NVRTC: pip install '.[nvrtc]'",
         "pip install '.[nvrtc]' from a checkout: cek's own NVRTC, no GPU package")]
    assert not any("cupy" in fix.lower() or "cuda1" in fix for _, fix in _problems(result))
    assert _lines(result, "verdict") == ["no NVIDIA driver, and 2 problems with what runs "
                                         "without one"]
    assert result.exit_code == 1
    assert result.stderr == ("Error: no NVIDIA driver, and what runs without one fails: "
                             "2 problems, each with its fix above\n")


@pytest.mark.emulator
def test_what_runs_without_a_driver_is_tried_for_real(machine, monkeypatch):
    """The three checks themselves, unstood-in: the CPU path against the float64 reference, the
    fused kernel on the emulator, and cek compile's NVRTC on it."""
    from cek import compile as compiler

    machine(libcuda=None, cupy=None, torch=None)
    monkeypatch.undo()  # the real checks and the real NVRTC, on this machine's facts
    monkeypatch.setattr(doctor, "libcuda", lambda: None)
    facts = doctor.Facts(no_driver=True)
    doctor.read_compile(facts)
    if facts.compile_error is not None:
        pytest.skip(f"no NVRTC here: {facts.compile_error}")
    doctor.read_what_runs_here(facts)
    runs = {run["what"]: run for run in facts.runs_here}
    assert list(runs) == list(RUNS_HERE)
    assert all(run["ok"] for run in runs.values()), runs
    assert runs["CPU path"]["detail"].startswith(
        "64 x 768 float32 matches the float64 reference (largest relative difference ")
    assert runs["emulator"]["detail"].startswith("the fused kernel's source matches")
    kernel = doctor.cek.kernel.kernel_classes()["fused"].for_n_dim(768, "f32")
    registers = compiler.compile_kernel(kernel, "sm_90").summary()["registers"]
    assert runs["cek compile"]["detail"] == (f"the fused kernel compiles for sm_90, "
                                             f"{registers} registers")


def test_a_gpu_host_tries_no_cpu_checks(machine):
    """With a driver, doctor behaves as before: the GPU path's facts and problems only."""
    machine(libcuda=Libcuda(cuda=13020), cupy=None, torch=None)
    result = _doctor()
    assert _lines(result, "runs here") == []
    assert result.exit_code == 1


def test_cupy_missing_on_a_gpu_host_names_the_extra_of_the_drivers_cuda(machine):
    machine(libcuda=Libcuda(cuda=13020), cupy=None, torch=None)
    result = _doctor()
    assert _lines(result, "driver") == ["version not known, supports CUDA 13.2"]
    assert _lines(result, "GPU 0") == ["NVIDIA H100 80GB HBM3, sm_90, 79.6 GiB"]
    assert _problems(result) == [("CuPy: not installed", CUDA13_LINE)]
    _exits_1_saying(result, 1)


def test_a_cupy_that_cannot_load_is_told_from_a_missing_one(machine):
    machine(libcuda=Libcuda(), wheels=["cupy-cuda12x"],
            cupy_error=ImportError("libcudart.so.12: cannot open shared object file"))
    result = _doctor()
    assert _problems(result) == [
        ("CuPy: cannot load: ImportError: libcudart.so.12: cannot open shared object file",
         CUDA12_LINE)]


def test_no_driver_with_cupy_installed(machine):
    """CuPy installed (the cuda12 line) on a host without a driver: said as it is, no problem
    of it (it needs a driver, which no package brings), and what runs here works."""
    machine(libcuda=None, cupy=_cupy(devices=None, driver=0), wheels=["cupy-cuda12x"])
    result = _doctor()
    assert _lines(result, "CuPy") == ["14.2.0 (cupy-cuda12x), built for CUDA 12.9, sees no GPU "
                                      "(no NVIDIA driver is installed)"]
    assert _lines(result, "NVRTC") == ["12.9, CuPy's: file not known"]
    assert _lines(result, "headers") == [
        "CUDA version not known: /site/nvidia/cuda_runtime/include"]
    assert _lines(result, "cek compile") == ["NVRTC 12.9 (CuPy's)"]
    _says_what_runs_here(result)


def test_a_driver_that_sees_no_gpu(machine):
    machine(libcuda=Libcuda(init=100), cupy=_cupy(devices=0), wheels=["cupy-cuda12x"])
    result = _doctor()
    assert _lines(result, "driver") == ["version not known, supports CUDA 12.4; the NVIDIA "
                                        "driver sees no GPU"]
    assert _problems(result)[0] == ("the NVIDIA driver sees no GPU",
                                    "nvidia-smi must list the GPU; a container must be started "
                                    "with it (docker run --gpus all)")
    assert len(_problems(result)) == 1  # CuPy's own "no GPU" is the same problem


def test_a_driver_older_than_cupys_cuda(machine):
    machine(libcuda=Libcuda(cuda=12040), cupy=_cupy(cuda=13020, devices=None, nvrtc=(13, 5)),
            wheels=["cupy-cuda13x"])
    result = _doctor()
    assert _problems(result)[0] == (
        "CuPy is built for CUDA 13.2, newer than the CUDA 12.4 the driver supports",
        f"pip uninstall cupy-cuda13x, then {CUDA12_LINE}")


def test_no_headers(machine, monkeypatch):
    machine(libcuda=Libcuda(), cupy=_cupy(headers=False), wheels=["cupy-cuda12x"])

    def refused(dtype):  # CuPy 14 compiles nothing without them, cek's kernels included
        raise RuntimeError("Failed to find CUDA headers.")

    monkeypatch.setattr(doctor, "_cupy_step", refused)
    result = _doctor()
    assert _lines(result, "launch") == [
        f"fused 64 x 768 {dtype}, CuPy: failed: RuntimeError: Failed to find CUDA headers."
        for dtype in ("float32", "float16")]  # no torch: through CuPy, in float16
    assert _lines(result, "headers")[0].startswith("none found (RuntimeError: Failed to find CUDA")
    assert ("CuPy finds no CUDA headers, so every CuPy compile fails (RuntimeError: Failed to "
            "find CUDA headers. Please install CUDA toolkit headers (e.g., pip install "
            "cupy-cuda12x[ctk]) or specify CUDA_PATH environment variable.)",
            "pip install nvidia-cuda-runtime-cu12") in _problems(result)


def test_an_nvrtc_newer_than_the_driver(machine, monkeypatch):
    # The environment: CuPy for CUDA 12 loading the NVRTC 13 of another wheel.
    machine(libcuda=Libcuda(cuda=12040), cupy=_cupy(nvrtc=(13, 5)), wheels=["cupy-cuda12x"],
            torch=_torch())
    nvrtc13 = "/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13"
    monkeypatch.setattr(doctor, "loaded_library", lambda stem: nvrtc13)

    def unloadable(dtype):  # what the driver says of a cubin of a newer CUDA
        raise RuntimeError("CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was compiled "
                           "with an unsupported toolchain.")

    monkeypatch.setattr(doctor, "_torch_step", unloadable)
    result = _doctor()
    assert _problems(result)[0] == (
        f"CuPy compiles with NVRTC 13.5 ({nvrtc13}), newer than the CUDA 12.4 the driver "
        "supports: what it compiles cannot load",
        f"pip uninstall -y nvidia-cuda-nvrtc, then {CUDA12_LINE}")
    assert _lines(result, "launch")[0] == (
        "fused 64 x 768 float32, cek.torch: failed: RuntimeError: "
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION: the provided PTX was compiled with an unsupported "
        "toolchain.")
    assert len(_problems(result)) == 3  # the NVRTC, and the two launches it broke


def test_no_nvrtc(machine):
    machine(libcuda=Libcuda(), cupy=_cupy(nvrtc=None, devices=0), wheels=["cupy-cuda12x"])
    result = _doctor()
    assert ('CuPy finds no NVRTC (OSError: Failure finding "libnvrtc.so.13 or libnvrtc.so.12")',
            "pip install nvidia-cuda-nvrtc-cu12") in _problems(result)


def test_torch_built_for_a_newer_cuda_than_the_driver(machine, monkeypatch):
    machine(libcuda=Libcuda(cuda=12040), cupy=_cupy(), wheels=["cupy-cuda12x"],
            torch=_torch("2.13.0+cu130", "13.0", devices=0))
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    result = _doctor()
    assert _lines(result, "torch") == ["2.13.0+cu130, built for CUDA 13.0, sees 0 GPUs"]
    assert _problems(result) == [(
        "torch 2.13.0+cu130 is built for CUDA 13.0, newer than the CUDA 12.4 the driver "
        "supports: torch.cuda.is_available() is False, cek.torch runs on the CPU",
        "pip uninstall -y torch, then install torch by the command PyTorch's install selector "
        "gives for CUDA 12.x (its own index: torch's default build is made for CUDA 13)")]


def test_a_cpu_build_of_torch_on_a_gpu_host(machine, monkeypatch):
    machine(libcuda=Libcuda(cuda=13020), cupy=_cupy(cuda=13020, nvrtc=(13, 0)),
            wheels=["cupy-cuda13x"], torch=_torch("2.13.0+cpu", None, devices=0))
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    assert _problems(_doctor()) == [(
        "torch 2.13.0+cpu is a CPU build: cek.torch runs on the CPU",
        "pip uninstall -y torch, then install torch by the command PyTorch's install selector "
        "gives for CUDA 13.x (its own index: torch's default build is made for CUDA 13)")]


def test_a_torch_that_cannot_load(machine, monkeypatch):
    unloadable = _Unloadable("torch")
    unloadable.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    machine(libcuda=Libcuda(), cupy=_cupy(), wheels=["cupy-cuda12x"], torch=unloadable)
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    result = _doctor()
    assert _lines(result, "torch") == ["cannot load: OSError: libcudnn.so.9: cannot open shared "
                                       "object file: No such file or directory"]
    assert [text for text, _ in _problems(result)] == [
        "torch: cannot load: OSError: libcudnn.so.9: cannot open shared object file: No such "
        "file or directory"]


def test_two_cupy_wheels(machine, monkeypatch):
    machine(libcuda=Libcuda(), cupy=_cupy(), wheels=["cupy-cuda12x", "cupy-cuda13x"])
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    assert _problems(_doctor()) == [(
        "2 CuPy wheels share one package directory (cupy-cuda12x, cupy-cuda13x)",
        f"pip uninstall cupy-cuda12x cupy-cuda13x, then {CUDA12_LINE}")]


def test_a_working_gpu_path_exits_0(machine, monkeypatch):
    machine(libcuda=Libcuda(), cupy=_cupy(), wheels=["cupy-cuda12x"], torch=_torch())
    monkeypatch.setattr(doctor, "DRIVER_VERSION_FILE", types.SimpleNamespace(read_text=lambda: (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC "
        "2024\nGCC version:  gcc version 12.2.0\n")))
    ran = []
    monkeypatch.setattr(doctor, "_torch_step", lambda dtype: ran.append(dtype) or _same(dtype))
    result = _doctor()
    assert result.exit_code == 0 and result.stderr == ""
    assert ran == ["f32", "bf16"]  # torch sees the GPU: through cek.torch, and in bfloat16
    assert _lines(result, "driver") == ["550.54.15, supports CUDA 12.4"]
    assert _lines(result, "torch") == ["2.13.0+cu126, built for CUDA 12.6, sees 1 GPU"]
    assert [line.split(":")[0] for line in _lines(result, "launch")] == [
        "fused 64 x 768 float32, cek.torch", "fused 64 x 768 bfloat16, cek.torch"]
    assert all(": matches the CPU path (largest relative difference 0.0e+00)" in line
               for line in _lines(result, "launch"))
    assert _lines(result, "verdict") == ["the GPU path can run"]


def test_json_has_the_facts_and_the_problems(machine):
    import json

    machine(libcuda=None, cupy=None, torch=None)
    result = _doctor("--json")
    data = json.loads(result.stdout)
    assert data["facts"]["cupy_error"] == "not installed"
    assert data["facts"]["no_driver"] is True and data["problems"] == []
    assert data["facts"]["runs_here"] == [{"what": what, "ok": True, "detail": f"{what} works"}
                                          for what in RUNS_HERE]
    assert result.exit_code == 4


def test_a_reader_that_fails_unforeseen_is_a_problem_not_a_traceback(machine, monkeypatch):
    machine(libcuda=Libcuda(), cupy=None, torch=None)

    def broken(facts):
        raise KeyError("name")

    monkeypatch.setattr(doctor, "read_torch", broken)
    assert ("reading torch failed: KeyError: 'name'", "report it, with this output") in \
        _problems(_doctor())


def test_a_bad_option_is_exit_2():
    result = CliRunner().invoke(doctor_report.doctor_command, ["--gpu"])
    assert result.exit_code == 2 and "No such option '--gpu'" in result.stderr


def test_the_cli_has_it_with_help_and_an_example():
    from cek.cli import main

    result = CliRunner().invoke(main, ["doctor", "--help"], prog_name="cek")
    assert result.exit_code == 0 and "Usage: cek doctor" in result.output
    assert "cek doctor > doctor.txt" in result.output


def _same(dtype):
    """A launch whose GPU result is the CPU path's, bit for bit."""
    x1, x2, y = doctor._inputs()
    x1, x2 = (doctor.cek.dtypes.from_float(x, dtype) for x in (x1, x2))
    want = [np.float32(0.25), np.zeros_like(x1), np.zeros_like(x2)]
    return want, want, (x1, x2, y)


# -- the comparison and the launch itself --------------------------------------------------------


def test_the_comparison_names_the_first_value_that_differs():
    x1, x2, y = doctor._inputs()
    want = list(doctor.cek.cosine_embedding_loss_fused(x1, x2, y, margin=doctor.MARGIN))
    assert doctor.compare(want, want, (x1, x2, y), "f32").startswith("matches the CPU path")
    wrong = [want[0], want[1].copy(), want[2]]
    wrong[1][3, 7] += 1e-3
    assert doctor.compare(wrong, want, (x1, x2, y), "f32").startswith(
        "differs from the CPU path: dx1[3, 7]: got ")


@pytest.mark.emulator
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_the_launch_through_cupy_runs_the_fused_kernel(monkeypatch, dtype):
    """The launch without torch, on the CuPy stand-in: the fused kernel's real source on the
    emulator, against the CPU path."""
    import fake_cupy

    standin = fake_cupy.install(monkeypatch)
    got, want, values = doctor._cupy_step(dtype)
    assert doctor.compare(got, want, values, dtype).startswith("matches the CPU path")
    assert "cosine_embedding_loss_fused" in " ".join(standin.ids())


def test_the_file_of_a_loaded_library_is_read_from_the_process_maps():
    libc = doctor.loaded_library("libc.so")  # every Python on Linux has it loaded
    assert libc is not None and doctor.Path(libc).name.startswith("libc.so.")
    assert doctor.loaded_library("libcek-never-loaded.so") is None  # every line read, no error


# -- the machine, first, and each line as it is known ----------------------------------------------


def test_the_machine_comes_first_with_exact_versions(machine, monkeypatch):
    """What a bug report needs before anything about CUDA: the OS and its C library, the CPU,
    Python, g++, numpy's (and every installed distribution's) exact version, and the variables
    that change what CUDA and CuPy do."""
    import platform

    machine(libcuda=None, cupy=None, torch=None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.delenv("CUPY_COMPILE_WITH_PTX", raising=False)
    result = _doctor()
    assert result.exit_code == 4
    labels = [label for label, _ in _rows(result)]
    assert labels.index("OS") < labels.index("driver")
    assert platform.libc_ver()[1] in _lines(result, "OS")[0]
    assert _lines(result, "Python")[0].startswith(platform.python_version() + " ")
    assert _lines(result, "g++")[0].startswith("g++")
    assert f"numpy {np.__version__}" in _lines(result, "package")
    assert _lines(result, "CUDA_VISIBLE_DEVICES") == ["3"]
    assert _lines(result, "CUPY_COMPILE_WITH_PTX") == ["(not set)"]


def test_each_line_is_printed_as_soon_as_it_is_known(machine, monkeypatch):
    """A doctor cut short by a timeout (a cold torch import, a hanging launch) has said what it
    read before: the driver's and CuPy's lines are out before torch is read."""
    machine(libcuda=Libcuda(cuda=13000), cupy=None, torch=None)
    said = []
    monkeypatch.setattr(doctor_report.click, "echo", lambda text="", **kwargs: said.append(text))
    monkeypatch.setattr(doctor, "read_torch", lambda facts: said.append("reading torch"))
    _doctor()
    at = said.index("reading torch")
    assert any(text.startswith("driver ") for text in said[:at])
    assert any(text.startswith("CuPy ") for text in said[:at])
    assert any(text.startswith("torch ") for text in said[at:])


class Libnvml:
    def nvmlInit_v2(self):
        return 0

    def nvmlSystemGetDriverVersion(self, buffer, size):
        buffer.value = b"580.65.06"
        return 0

    def nvmlShutdown(self):
        return 0


def test_the_drivers_version_comes_from_the_driver_where_proc_has_none(machine, monkeypatch):
    machine(libcuda=Libcuda(cuda=13000), cupy=None, torch=None)  # DRIVER_VERSION_FILE: absent
    monkeypatch.setattr(doctor, "libnvml", Libnvml)
    assert _lines(_doctor(), "driver") == ["580.65.06, supports CUDA 13.0"]


# -- the arch, PTX mode, torch on the CPU, the install trap ----------------------------------------


def _no_binary(dtype):  # what CuPy says loading a cubin of another major's arch
    raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU: no kernel image is available for "
                       "execution on the device")


def test_an_nvrtc_too_old_for_the_gpus_arch(machine, monkeypatch):
    # NVRTC 12.6 knows sm_90 at most: CuPy builds sm_90 SASS, which an sm_100 GPU cannot load.
    machine(libcuda=Libcuda(cuda=12080, gpus=(B200, B200)), cupy=_cupy(cuda=12060, nvrtc=(12, 6)),
            wheels=["cupy-cuda12x"], archs=NVRTC_12_6_ARCHS)
    monkeypatch.delenv("CUPY_COMPILE_WITH_PTX", raising=False)
    monkeypatch.setattr(doctor, "_cupy_step", _no_binary)
    result = _doctor()
    assert _lines(result, "archs") == [", ".join(NVRTC_12_6_ARCHS)]
    assert _problems(result)[0] == (
        "GPU 0 (NVIDIA B200), 1 (NVIDIA B200) is sm_100, newer than NVRTC 12.6 knows: CuPy "
        "compiles for sm_90, the newest it knows, which an sm_100 GPU cannot load",
        "pip install -U nvidia-cuda-nvrtc-cu12: the newest NVRTC 12.x knows the newest archs")
    _exits_1_saying(result, 3)  # the arch, and the two launches it broke


def test_an_nvrtc_too_old_for_the_arch_that_torch_pins_comes_with_a_newer_torch(machine,
                                                                                monkeypatch):
    machine(libcuda=Libcuda(cuda=12080, gpus=(RTX_5090,)), cupy=_cupy(cuda=12060, nvrtc=(12, 6)),
            wheels=["cupy-cuda12x"], archs=NVRTC_12_6_ARCHS, torch=_torch(),
            pinned={"nvidia-cuda-nvrtc-cu12": ["torch"]})
    monkeypatch.delenv("CUPY_COMPILE_WITH_PTX", raising=False)
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    assert _problems(_doctor()) == [(
        "GPU 0 (NVIDIA GeForce RTX 5090) is sm_120, newer than NVRTC 12.6 knows: CuPy compiles "
        "for sm_90, the newest it knows, which an sm_120 GPU cannot load",
        "pip uninstall -y torch, then install torch by the command PyTorch's install selector "
        "gives for its newest CUDA 12.x, whose NVRTC knows the newest archs (torch 2.13.0+cu126 "
        "pins nvidia-cuda-nvrtc-cu12)")]


@pytest.mark.parametrize("gpu, archs", [
    (H100, NVRTC_12_6_ARCHS),   # sm_90 itself
    (("NVIDIA GB10", 12, 1, 0), NVRTC_12_9_ARCHS[:-1]),  # sm_121 beside sm_120's SASS: loads
])
def test_an_arch_the_nvrtc_serves_is_no_problem(machine, monkeypatch, gpu, archs):
    machine(libcuda=Libcuda(cuda=12080, gpus=(gpu,)), cupy=_cupy(), wheels=["cupy-cuda12x"],
            archs=archs)
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    assert _problems(_doctor()) == []


def test_in_ptx_mode_an_old_nvrtc_serves_a_new_arch(machine, monkeypatch):
    # PTX of compute_90 is compiled by the driver for sm_100: no arch problem.
    machine(libcuda=Libcuda(cuda=12080, gpus=(B200,)), cupy=_cupy(cuda=12060, nvrtc=(12, 6)),
            wheels=["cupy-cuda12x"], archs=NVRTC_12_6_ARCHS)
    monkeypatch.setenv("CUPY_COMPILE_WITH_PTX", "1")
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    result = _doctor()
    assert _lines(result, "CUPY_COMPILE_WITH_PTX") == ["1"]
    assert _problems(result) == []


@pytest.mark.parametrize("ptx, problem", [("1", True), ("0", False), ("", False)])
def test_ptx_mode_with_an_nvrtc_newer_than_the_driver(machine, monkeypatch, ptx, problem):
    # NVRTC 12.9's PTX needs a 12.9 driver; its SASS loads on 12.4's, which outside PTX mode
    # is what CuPy hands the driver.
    machine(libcuda=Libcuda(cuda=12040), cupy=_cupy(nvrtc=(12, 9)), wheels=["cupy-cuda12x"])
    monkeypatch.setenv("CUPY_COMPILE_WITH_PTX", ptx)
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    assert _problems(_doctor()) == ([(
        "CUPY_COMPILE_WITH_PTX=1: CuPy hands the driver PTX of NVRTC 12.9, newer than the CUDA "
        "12.4 the driver supports, which cannot load it",
        "unset CUPY_COMPILE_WITH_PTX (CuPy then compiles SASS, which a driver of CUDA 12.x loads "
        "from any NVRTC 12.x), or pip install 'nvidia-cuda-nvrtc-cu12<12.5'")] if problem else [])


def test_a_gpu_below_the_arch_floor_of_every_nvrtc(machine, monkeypatch):
    machine(libcuda=Libcuda(gpus=(P100,)), cupy=_cupy(), wheels=["cupy-cuda12x"])
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    assert _problems(_doctor()) == [(
        "GPU 0 (Tesla P100-PCIE-16GB) is sm_60, older than sm_70, the oldest arch cek compiles "
        "for with NVRTC 12.9",
        "none for this GPU: cek's GPU path needs sm_70 or newer; the CPU path runs here (cek "
        "check --device cpu, cek.torch on CPU tensors)")]


def test_a_gpu_below_the_arch_floor_of_cuda_13s_nvrtc_runs_with_cuda_12s(machine, monkeypatch):
    machine(libcuda=Libcuda(cuda=13000, gpus=(V100,)), cupy=_cupy(cuda=13000, nvrtc=(13, 0)),
            wheels=["cupy-cuda13x"], archs=NVRTC_13_0_ARCHS)
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    assert _problems(_doctor()) == [(
        "GPU 0 (Tesla V100-SXM2-16GB) is sm_70, older than sm_75, the oldest arch cek compiles "
        "for with NVRTC 13.0",
        "pip uninstall -y cupy-cuda13x nvidia-cuda-nvrtc nvidia-cuda-runtime, then "
        f"{CUDA12_LINE}: NVRTC 12 compiles for sm_70, and a 13.x driver runs what it compiles")]


@pytest.mark.parametrize("torch, problem", [
    (_torch("2.13.0+cu130", "13.0", devices=0), "torch 2.13.0+cu130 is built for CUDA 13.0, "
     "newer than the CUDA 12.4 the driver supports: torch.cuda.is_available() is False, "
     "cek.torch runs on the CPU"),
    (_torch("2.13.0+cpu", None, devices=0), "torch 2.13.0+cpu is a CPU build: cek.torch runs "
     "on the CPU"),
])
def test_torch_on_the_cpu_while_the_cupy_path_runs_exits_3(machine, monkeypatch, torch, problem):
    machine(libcuda=Libcuda(cuda=12040), cupy=_cupy(), wheels=["cupy-cuda12x"], torch=torch)
    ran = []
    monkeypatch.setattr(doctor, "_cupy_step", lambda dtype: ran.append(dtype) or _same(dtype))
    result = _doctor()
    assert ran == ["f32", "f16"]  # torch sees no GPU: the launch goes through CuPy, and runs
    assert [text for text, _ in _problems(result)] == [problem]
    assert _lines(result, "verdict") == [
        "the CuPy path runs on the GPU; cek.torch runs on the CPU: 1 problem"]
    assert result.exit_code == 3
    assert result.stderr == ("Error: cek.torch runs on the CPU here, the CuPy path on the GPU: "
                             "1 problem, each with its fix above\n")
    assert _doctor("--json").exit_code == 3


def test_torch_on_the_cpu_with_a_failed_cupy_launch_exits_1(machine, monkeypatch):
    machine(libcuda=Libcuda(cuda=12040), cupy=_cupy(), wheels=["cupy-cuda12x"],
            torch=_torch("2.13.0+cpu", None, devices=0))
    monkeypatch.setattr(doctor, "_cupy_step", _no_binary)
    _exits_1_saying(_doctor(), 3)


def test_the_help_names_exit_4():
    result = CliRunner().invoke(doctor_report.doctor_command, ["--help"], prog_name="cek doctor")
    assert ("4 when there is no NVIDIA driver, and the CPU path, the emulator and cek compile "
            "work") in " ".join(result.output.split())


def test_the_help_names_exit_3():
    result = CliRunner().invoke(doctor_report.doctor_command, ["--help"], prog_name="cek doctor")
    assert "3 when the CuPy path runs on the GPU" in " ".join(result.output.split())


def test_the_install_trap_is_fixed_without_breaking_torch(machine, monkeypatch):
    """`pip install '.[cuda12,torch]'` with no torch for CUDA 12 first: torch's default build
    (CUDA 13) pins nvidia-cuda-nvrtc 13.0.88, which CuPy for CUDA 12 loads. Uninstalling that
    wheel alone would leave torch without what it pins: torch goes with it, and torch for
    CUDA 12 brings its own NVRTC 12."""
    machine(libcuda=Libcuda(cuda=12040), cupy=_cupy(nvrtc=(13, 0)), wheels=["cupy-cuda12x"],
            torch=_torch("2.13.0+cu130", "13.0", devices=0),
            pinned={"nvidia-cuda-nvrtc": ["torch"]})
    nvrtc13 = "/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13"
    monkeypatch.setattr(doctor, "loaded_library", lambda stem: nvrtc13)
    monkeypatch.setattr(doctor, "_cupy_step", _no_binary)
    result = _doctor()
    assert _problems(result)[0] == (
        f"CuPy compiles with NVRTC 13.0 ({nvrtc13}), newer than the CUDA 12.4 the driver "
        "supports: what it compiles cannot load (torch 2.13.0+cu130 pins nvidia-cuda-nvrtc)",
        "pip uninstall -y torch nvidia-cuda-nvrtc, then install torch by the command PyTorch's "
        "install selector gives for CUDA 12.x (its own index: torch's default build is made for "
        "CUDA 13)")
    _exits_1_saying(result, 4)  # the NVRTC, torch's CUDA, the two CuPy launches


def test_required_by_reads_each_distributions_own_requirements(monkeypatch):
    def dist(name, *requires):
        return types.SimpleNamespace(metadata={"Name": name}, requires=list(requires))

    installed = [dist("torch", 'nvidia-cuda-nvrtc==13.0.88; platform_system == "Linux"'),
                 dist("cek", 'nvidia-cuda-nvrtc>=13.0.88,<13.6; extra == "nvrtc"'),
                 dist("other", "Nvidia_Cuda.NVRTC>=13"), dist("cu12", "nvidia-cuda-nvrtc-cu12"),
                 dist("none")]
    monkeypatch.setattr(doctor_fixes.importlib.metadata, "distributions", lambda: installed)
    assert doctor_fixes.required_by("nvidia-cuda-nvrtc") == ["other", "torch"]


def test_the_docs_give_doctors_exit_codes():
    """docs/install.md and docs/cli.md state the codes cek/doctor_fixes.py exits with."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for page in ("install.md", "cli.md"):
        text = (root / "docs" / page).read_text()
        assert f"| {doctor_fixes.TORCH_ON_CPU} | the CuPy path runs on the GPU" in text, page
        assert f"| {doctor_fixes.NO_DRIVER} | no NVIDIA driver" in text, page
