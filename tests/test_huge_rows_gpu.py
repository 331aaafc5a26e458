"""gpu tier: rows up to each dtype's largest finite values give the formula's loss and gradients
on the GPU too: the emulator tier's test (tests/test_cosine_embedding_loss.py), with the kernels
launched on the device, so scripts/device_check.sh (`pytest -m gpu`) runs it; and its CPU
twin, on the stand-in for CuPy (emulator tier)."""

import pytest

from cek import check
from test_cosine_embedding_loss import _huge_cases, _id
from test_cosine_embedding_loss import (
    test_rows_up_to_the_largest_finite_values_give_the_formulas_results as _judge)


@pytest.mark.gpu
@pytest.mark.parametrize("cls, n_dim, dtype", _huge_cases(), ids=_id)
def test_gpu_rows_up_to_the_largest_finite_values(cls, n_dim, dtype):
    _judge({"random:1": check.gpu_launcher()}, cls, n_dim, dtype)


@pytest.mark.emulator
@pytest.mark.parametrize("cls, n_dim, dtype", [c for c in _huge_cases() if c[1] == 33], ids=_id)
def test_the_same_through_the_gpu_launcher_on_the_stand_in(monkeypatch, cls, n_dim, dtype):
    """The test above, check.gpu_launcher and all, on the stand-in for CuPy with the emulator
    as the GPU (tests/fake_cupy.py), at its smallest widths, so that CI checks its way."""
    import fake_cupy

    fake_cupy.install(monkeypatch)
    _judge({"random:1": check.gpu_launcher()}, cls, n_dim, dtype)
