"""The CPU path is at least as fast as PyTorch's CPU forward + backward, timed in one run.

The timing is scripts/cpu_speed.py's (the table in docs/cpu.md): repetitions interleave the two
and each side keeps its best time, so a busy machine slows both alike. What runs is what a user
gets: the compiled rows (cek/cpu_native.cpp) where g++ is on PATH, as it is wherever the tests
run (the emulator needs it too). bfloat16 is cek's dtype="bfloat16" path on the tensors' bits
against torch's bfloat16 forward + backward.
"""

import importlib.util
from pathlib import Path

import pytest

from cek import cpu_native

pytest.importorskip("torch", reason="PyTorch (CPU) is the baseline of this benchmark")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cpu_speed.py"
spec = importlib.util.spec_from_file_location("cpu_speed", SCRIPT)
cpu_speed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_speed)

REPEATS = 3


@pytest.mark.parametrize("dtype", cpu_speed.DTYPES)
@pytest.mark.parametrize("n, d", cpu_speed.SHAPES)
def test_fused_is_at_least_as_fast_as_torch_forward_backward(n, d, dtype):
    assert cpu_native.unavailable_reason() is None, cpu_native.unavailable_reason()
    cek_s, torch_s = cpu_speed.row(n, d, dtype, REPEATS)
    assert cek_s <= torch_s, f"cek {cek_s * 1e3:.1f} ms, torch {torch_s * 1e3:.1f} ms"
