"""cpu tier: `cek doctor` on every environment a user can have, without a GPU: the driver's
library (libcuda), CuPy and torch are stood in for, one case each. Every case ends in a report,
its problems each with a fix, and exit 0 or 1: never a traceback. The launch it runs where a
GPU is usable runs here on the CuPy stand-in with the emulator (emulator tier)."""

import importlib.machinery
import sys
import types

import numpy as np
import pytest
from click.testing import CliRunner

from cek import doctor

H100 = ("NVIDIA H100 80GB HBM3", 9, 0, 85_520_809_984)
INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver, CuPy's status without a driver


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

    def setup(libcuda=None, cupy=None, torch=None, wheels=(), cupy_error=None):
        monkeypatch.setattr(doctor, "libcuda", lambda: libcuda)
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

    return setup


def _doctor(*args):
    """`cek doctor`: its result, having checked that it ended as a command must."""
    result = CliRunner().invoke(doctor.doctor_command, list(args), prog_name="cek doctor")
    assert result.exit_code in (0, 1), result.output
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


def test_no_driver_no_cupy_no_torch(machine):
    machine(libcuda=None, cupy=None, torch=None)
    result = _doctor()
    assert _lines(result, "driver") == ["no NVIDIA driver (libcuda.so.1 is not installed)"]
    assert _lines(result, "CuPy") == ["not installed"]
    assert _lines(result, "torch") == ["not installed"]
    assert _lines(result, "launch") == ["not run: CuPy reaches no GPU"]
    assert [text for text, _ in _problems(result)] == [
        "no NVIDIA driver (libcuda.so.1 is not installed)", "CuPy: not installed"]
    # without a driver there is no CUDA version to choose by: both lines
    assert _problems(result)[1][1] == ("pip install '.[cuda12]' for a CUDA 12.x driver, "
                                       "'.[cuda13]' for 13.x")
    _exits_1_saying(result, 2)


def test_cupy_missing_on_a_gpu_host_names_the_extra_of_the_drivers_cuda(machine):
    machine(libcuda=Libcuda(cuda=13020), cupy=None, torch=None)
    result = _doctor()
    assert _lines(result, "driver") == ["version not known, supports CUDA 13.2"]
    assert _lines(result, "GPU 0") == ["NVIDIA H100 80GB HBM3, sm_90, 79.6 GiB"]
    assert _problems(result) == [("CuPy: not installed", "pip install '.[cuda13]'")]
    _exits_1_saying(result, 1)


def test_a_cupy_that_cannot_load_is_told_from_a_missing_one(machine):
    machine(libcuda=Libcuda(), wheels=["cupy-cuda12x"],
            cupy_error=ImportError("libcudart.so.12: cannot open shared object file"))
    result = _doctor()
    assert _problems(result) == [
        ("CuPy: cannot load: ImportError: libcudart.so.12: cannot open shared object file",
         "pip install '.[cuda12]'")]


def test_no_driver_with_cupy_installed(machine):
    machine(libcuda=None, cupy=_cupy(devices=None, driver=0), wheels=["cupy-cuda12x"])
    result = _doctor()
    assert _lines(result, "CuPy") == ["14.2.0 (cupy-cuda12x), built for CUDA 12.9, sees no GPU "
                                      "(no NVIDIA driver is installed)"]
    assert _lines(result, "NVRTC") == ["12.9, CuPy's: file not known"]
    assert _lines(result, "headers") == [
        "CUDA version not known: /site/nvidia/cuda_runtime/include"]
    assert _lines(result, "cek compile") == ["NVRTC 12.9 (CuPy's)"]
    assert [text for text, _ in _problems(result)] == [
        "no NVIDIA driver (libcuda.so.1 is not installed)"]


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
        "pip uninstall cupy-cuda13x, then pip install '.[cuda12]'")


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
        "pip uninstall nvidia-cuda-nvrtc, then pip install '.[cuda12]'")
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
        "install the torch built for CUDA 12.x by the command PyTorch's install selector gives, "
        "then pip install '.[torch]'")]


def test_a_cpu_build_of_torch_on_a_gpu_host(machine, monkeypatch):
    machine(libcuda=Libcuda(cuda=13020), cupy=_cupy(cuda=13020, nvrtc=(13, 0)),
            wheels=["cupy-cuda13x"], torch=_torch("2.13.0+cpu", None, devices=0))
    monkeypatch.setattr(doctor, "run_launches", lambda facts: None)
    assert _problems(_doctor()) == [(
        "torch 2.13.0+cpu is a CPU build: cek.torch runs on the CPU",
        "install the torch built for CUDA 13.x by the command PyTorch's install selector gives, "
        "then pip install '.[torch]'")]


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
        "pip uninstall cupy-cuda12x cupy-cuda13x, then pip install '.[cuda12]'")]


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
    assert [p["text"] for p in data["problems"]] == [
        "no NVIDIA driver (libcuda.so.1 is not installed)", "CuPy: not installed"]


def test_a_reader_that_fails_unforeseen_is_a_problem_not_a_traceback(machine, monkeypatch):
    machine(libcuda=Libcuda(), cupy=None, torch=None)

    def broken(facts):
        raise KeyError("name")

    monkeypatch.setattr(doctor, "read_torch", broken)
    assert ("reading torch failed: KeyError: 'name'", "report it, with this output") in \
        _problems(_doctor())


def test_a_bad_option_is_exit_2():
    result = CliRunner().invoke(doctor.doctor_command, ["--gpu"])
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
