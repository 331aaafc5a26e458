"""Test tiers: cpu (always), compile (NVRTC, no GPU), emulator (g++, no GPU), gpu (a device).

Each tier skips with a reason when what it needs is absent, never silently.
"""

import shutil
import signal
from importlib import metadata
from pathlib import Path

import pytest

CONSTRAINTS = Path(__file__).resolve().parent.parent / ".ci" / "constraints.txt"


def script_module(name: str):
    """scripts/<name>.py as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sigint_as_a_terminal_sends_it():
    """preexec_fn of a child a test sends SIGINT to: SIGINT's default action, as a terminal's
    Ctrl-C finds it. A test run started as a shell's background job inherits SIGINT ignored, and
    Python leaves an ignored SIGINT ignored: the child would never see the interrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _gpu_count() -> int:
    from cek import gpu

    return gpu.device_count()


def _toolchain_mismatch() -> str | None:
    """Why exact SASS counts do not hold here: a package of .ci/constraints.txt installed at
    another version than pinned (None when every pin holds)."""
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        name, pinned = line.split("==")
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = "not installed"
        if have != pinned:
            return (f"exact SASS counts are pinned for {name}=={pinned} (.ci/constraints.txt); "
                    f"this environment has {have}")
    return None


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="no CUDA device (CuPy missing or no GPU): gpu tier skipped")
    no_gxx = pytest.mark.skip(reason="no g++ on PATH: the CPU emulator cannot build kernels")
    mismatch = None
    # Markers, not keywords: a parameter id such as "gpu" is a keyword too.
    if any(item.get_closest_marker("exact_sass") for item in items):
        mismatch = _toolchain_mismatch()
    have_gpu = None
    for item in items:
        if mismatch and item.get_closest_marker("exact_sass"):
            item.add_marker(pytest.mark.skip(reason=mismatch))
        if item.get_closest_marker("gpu"):
            if have_gpu is None:
                have_gpu = _gpu_count() > 0
            if not have_gpu:
                item.add_marker(no_gpu)
        if item.get_closest_marker("emulator") and shutil.which("g++") is None:
            item.add_marker(no_gxx)


def bench_calls(monkeypatch, args: list[str]) -> list[tuple]:
    """(kernels, n_rows, n_dim, providers, dtype) of each run_bench call `cek bench ARGS` makes,
    with a device and CUDA planted and nothing timed."""
    import torch
    from click.testing import CliRunner

    from cek import bench, gpu
    from cek.cli import main

    calls = []

    def run_bench(kernels, n_rows, n_dim, providers, repeat, margin, dtype, **callbacks):
        calls.append((tuple(kernels), n_rows, n_dim, tuple(providers), dtype))
        return [], []

    monkeypatch.setattr(gpu, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # CUDA graphs: cek-torch-graph
    monkeypatch.setattr(bench, "run_bench", run_bench)
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 0, result.output
    return calls
