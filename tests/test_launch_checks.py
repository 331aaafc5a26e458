"""A low-level launch (cek.emulate.load, cek.gpu.load) must be the launch the kernel was written
for: Kernel.check_launch refuses any other grid or block before anything runs."""

import types

import numpy as np
import pytest

import cek
from cek import emulate, gpu
from cek.kernel import kernel_classes


def forward_args(n_rows, n_dim):
    rng = np.random.default_rng(0)
    x1, x2 = (rng.standard_normal((n_rows, n_dim)).astype(np.float32) for _ in range(2))
    y = np.ones(n_rows, np.float32)
    out = np.full(n_rows, np.nan, np.float32)
    return (x1, x2, y, out, n_rows, n_dim, 0.0), out


@pytest.mark.parametrize("name", sorted(kernel_classes()))
@pytest.mark.parametrize("n_rows, n_dim", [(4, 768), (7, 31), (1000, 4)])
def test_only_the_launch_config_passes(name, n_rows, n_dim):
    kernel = kernel_classes()[name].for_n_dim(n_dim)
    grid, block, _ = kernel.launch_config(n_rows, n_dim)
    kernel.check_launch(grid, block, n_rows, n_dim)
    kernel.check_launch(grid[0], list(block[:1]), n_rows, n_dim)  # as CuPy takes them
    for bad_grid, bad_block in [((grid[0] - 1,), block), ((grid[0] + 1,), block),
                                (grid, (block[0] + 32,)), (grid, (block[0], 2)), ("4", block)]:
        if bad_grid[0] == 0:
            continue
        with pytest.raises(ValueError, match=r"differ from launch_config\(.*grid \(.*block \("):
            kernel.check_launch(bad_grid, bad_block, n_rows, n_dim)


def test_a_kernel_built_for_narrower_rows_is_refused():
    with pytest.raises(ValueError, match="n_dim=768 needs block_size=1024"):
        cek.CosineEmbeddingLossFused(32).check_launch((768,), (256,), 3, 768)


@pytest.mark.parametrize("n_rows", [2**31, 2**40])
def test_launch_config_refuses_a_row_count_the_kernels_cannot_take(n_rows):
    with pytest.raises(ValueError, match=f"n_rows must be below 2\\^31 .*got {n_rows}"):
        cek.CosineEmbeddingLossForward.for_n_dim(768).launch_config(n_rows, 768)


@pytest.mark.emulator
def test_the_emulator_refuses_a_wrong_launch_before_running_it():
    kernel = cek.CosineEmbeddingLossForward.for_n_dim(768)
    args, out = forward_args(4, 768)
    launch = emulate.load(kernel)
    with pytest.raises(ValueError, match=r"grid \(4,\), block \(32,\) differ.*block \(192, 1, 1\)"):
        launch((4,), (32,), args)
    with pytest.raises(ValueError, match="differ from launch_config"):
        launch((3,), (192,), args)
    assert np.isnan(out).all()
    launch((4,), (192,), args)
    assert not np.isnan(out).any()


def test_the_gpu_launcher_refuses_a_wrong_launch_before_compiling(monkeypatch):
    def no_compile(*_args, **_kwargs):
        raise AssertionError("compiled a kernel for a launch that should have been refused")

    cupy = types.SimpleNamespace(ndarray=np.ndarray)
    monkeypatch.setattr(gpu, "require_cupy", lambda: cupy)
    monkeypatch.setattr(gpu, "get_function", no_compile)
    args, _ = forward_args(4, 768)
    with pytest.raises(ValueError, match=r"grid \(4,\), block \(32,\) differ"):
        gpu.load(cek.CosineEmbeddingLossForward.for_n_dim(768))((4,), (32,), args)
