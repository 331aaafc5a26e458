"""Test tiers: cpu (always), compile (NVRTC, no GPU), emulator (g++, no GPU), gpu (a device).

Each tier skips with a reason when what it needs is absent, never silently.
"""

import shutil

import pytest


def _gpu_count() -> int:
    from cek import gpu

    return gpu.device_count()


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="no CUDA device (CuPy missing or no GPU): gpu tier skipped")
    no_gxx = pytest.mark.skip(reason="no g++ on PATH: the CPU emulator cannot build kernels")
    have_gpu = None
    for item in items:
        if "gpu" in item.keywords:
            if have_gpu is None:
                have_gpu = _gpu_count() > 0
            if not have_gpu:
                item.add_marker(no_gpu)
        if "emulator" in item.keywords and shutil.which("g++") is None:
            item.add_marker(no_gxx)
