"""cpu tier: CuPy installed but no usable CUDA device (no driver, an old driver, no GPU).

CuPy's own error on a machine without an NVIDIA driver is cudaErrorInsufficientDriver, "CUDA
driver version is insufficient for CUDA runtime version", which reads as "upgrade the driver".
cek says what it found, in one line, and what runs instead.
"""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

import cek
from cek import gpu
from cek.cli import main

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = 13020  # CUDA 13.2, as CuPy's runtimeGetVersion gives it


class CUDARuntimeError(RuntimeError):
    """As CuPy's: the CUDA status, and its name and text in the message."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


INSUFFICIENT_DRIVER = (35, "cudaErrorInsufficientDriver: CUDA driver version is insufficient "
                           "for CUDA runtime version")


def _cupy(driver: int, count: int | None = None, error=INSUFFICIENT_DRIVER):
    """A cupy module whose runtime has driver version `driver` (0: no driver loaded) and, with
    `count`, sees that many GPUs; without it, getDeviceCount raises CuPy's `error`."""

    def get_device_count():
        if count is None:
            raise CUDARuntimeError(*error)
        return count

    runtime = types.SimpleNamespace(getDeviceCount=get_device_count,
                                    driverGetVersion=lambda: driver,
                                    runtimeGetVersion=lambda: RUNTIME)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))


@pytest.fixture
def only_once(monkeypatch):
    """The process-wide once-only notice, as in a fresh process."""
    monkeypatch.setattr(gpu, "_noticed", False)


@pytest.mark.parametrize("cupy, reason", [
    (_cupy(driver=0), "no NVIDIA driver is installed"),
    (_cupy(driver=12040), "the NVIDIA driver supports CUDA 12.4, older than the CUDA 13.2 "
                          "that CuPy was built for"),
    (_cupy(driver=13020, count=0), "the NVIDIA driver sees no GPU"),
    (_cupy(driver=13020, error=(100, "cudaErrorNoDevice: no CUDA-capable device is detected")),
     "the NVIDIA driver sees no GPU"),
], ids=["no-driver", "old-driver", "no-gpu", "no-gpu-error"])
def test_a_launch_without_a_usable_device_says_why_in_one_line(monkeypatch, cupy, reason):
    monkeypatch.setattr(gpu, "cupy_or_none", lambda: cupy)
    assert gpu.device_count() == 0
    for entry in (lambda: gpu.load(cek.CosineEmbeddingLossForward(8)),
                  lambda: gpu.launch(cek.CosineEmbeddingLossForward(8), *([None] * 7))):
        with pytest.raises(gpu.NoDeviceError) as info:
            entry()
        message = str(info.value)
        assert message == (f"no CUDA device found; {gpu.NO_DEVICE_HINT}, and NumPy arrays run "
                           f"on the CPU ({reason})"), message
    assert gpu.no_device_reason() == reason


def test_a_usable_device_has_no_reason(monkeypatch):
    monkeypatch.setattr(gpu, "cupy_or_none", lambda: _cupy(driver=13020, count=2))
    assert gpu.device_count() == 2 and gpu.no_device_reason() is None


def test_without_cupy_the_reason_is_that(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` fails, as if not installed
    assert gpu.no_device_reason() == "CuPy is not installed"


def test_a_cupy_that_fails_to_import_is_told_from_a_missing_one(monkeypatch):
    monkeypatch.setattr(gpu, "cupy_or_none", lambda: None)  # installed, but its import fails
    monkeypatch.setattr(gpu.importlib.util, "find_spec", lambda name: object())
    assert gpu.no_device_reason() == "CuPy is installed but cannot load its CUDA libraries"


def test_the_notice_is_one_line_once_a_process(monkeypatch, only_once):
    monkeypatch.setattr(gpu, "cupy_or_none", lambda: _cupy(driver=0))
    assert gpu.no_device_notice("checking on the CPU emulator") == (
        "no usable CUDA device (no NVIDIA driver is installed): checking on the CPU emulator")
    assert gpu.no_device_notice("checking on the CPU emulator") is None


def _reference_launch(kernel, args):
    """The emulator's place in `cek check`: writes what a right kernel writes (the reference)."""
    from cek import check

    inputs = dict(zip((a.name for a in kernel.args), args))
    inputs.update(dtype=kernel.dtype, scale=1.0)
    want, _ = check.expected(kernel, inputs, inputs["margin"])
    for name, value in want.items():
        inputs[name][...] = value


def test_check_says_once_why_it_runs_on_the_emulator(monkeypatch, only_once):
    from cek import check

    monkeypatch.setattr(gpu, "cupy_or_none", lambda: _cupy(driver=0))
    monkeypatch.setattr(check, "emulator_launcher", lambda sanitize=None: _reference_launch)
    result = CliRunner().invoke(main, ["check", "--kernel", "forward", "--n-dim", "8",
                                       "--dtype", "f32"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ("no usable CUDA device (no NVIDIA driver is installed): checking on "
                             "the CPU emulator\n")
    assert result.stdout.splitlines()[-1] == "3 passed, 0 failed"


def test_check_on_the_emulator_by_choice_says_nothing(monkeypatch, only_once):
    from cek import check

    monkeypatch.setattr(gpu, "cupy_or_none", lambda: _cupy(driver=0))
    monkeypatch.setattr(check, "emulator_launcher", lambda sanitize=None: _reference_launch)
    result = CliRunner().invoke(main, ["check", "--device", "cpu", "--kernel", "forward",
                                       "--n-dim", "8", "--dtype", "f32"])
    assert result.exit_code == 0 and result.stderr == ""


def _real_cupy_without_a_driver() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.driverGetVersion() == 0
    except Exception:
        return False


@pytest.mark.emulator
@pytest.mark.skipif(not _real_cupy_without_a_driver(),
                    reason="needs CuPy installed on a machine without an NVIDIA driver")
def test_the_real_cupy_without_a_driver():
    """As a user meets it: CuPy installed, no driver. `cek check` says so and runs the
    emulator; a GPU entry point fails with cek's line, not CuPy's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "cek", "check", "--kernel", "forward",
                           "--n-dim", "8", "--dtype", "f32"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ("no usable CUDA device (no NVIDIA driver is installed): checking on "
                           "the CPU emulator\n")
    code = ("import cek\n"
            "try:\n"
            "    cek.gpu.load(cek.CosineEmbeddingLossForward(8))\n"
            "except cek.gpu.NoDeviceError as exc:\n"
            "    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.startswith("no CUDA device found; ") and \
        proc.stdout.endswith("(no NVIDIA driver is installed)\n"), proc.stdout + proc.stderr
