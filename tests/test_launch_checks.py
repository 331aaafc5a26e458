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


WAVE_GRIDS = sorted(name for name, cls in kernel_classes().items()
                    if getattr(cls, "wave_grid", False))


@pytest.mark.parametrize("name", sorted(set(kernel_classes()) - set(WAVE_GRIDS)))
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


@pytest.mark.parametrize("name", WAVE_GRIDS)
@pytest.mark.parametrize("n_rows, n_dim", [(4, 768), (7, 31), (1000, 4)])
def test_a_wave_grid_takes_any_grid_up_to_a_block_a_row(name, n_rows, n_dim):
    """The keep kernels: grid [G] with 1 <= G <= the block-a-row grid, each block taking an even
    share; the launchers' G is a wave of the device's SMs (launch_config's sms)."""
    assert name in ("backward-keep", "backward-keep-split")
    kernel = kernel_classes()[name].for_n_dim(n_dim)
    (most, _, _), block, _ = kernel.launch_config(n_rows, n_dim)
    for grid in sorted({1, max(1, most // 2), most}):
        kernel.check_launch((grid,), block, n_rows, n_dim)
    assert kernel.launch_config(n_rows, n_dim, sms=1)[0] == (min(most, kernel.min_blocks), 1, 1)
    assert kernel.launch_config(n_rows, n_dim, sms=132)[0] == \
        (min(most, 132 * kernel.min_blocks), 1, 1)
    for bad_grid, bad_block in [((most + 1,), block), ((0,), block), ((most, 2), block),
                                ((most,), (block[0] + 32,)), ("4", block)]:
        with pytest.raises(ValueError, match=r"takes block .* and grid \[G, 1, 1\] with 1 <= G"):
            kernel.check_launch(bad_grid, bad_block, n_rows, n_dim)
    with pytest.raises(ValueError, match="sms must be a positive int, got 0"):
        kernel.launch_config(n_rows, n_dim, sms=0)


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
    with pytest.raises(ValueError, match=r"grid \(4,\), block \(32,\) differ.*block \(96, 1, 1\)"):
        launch((4,), (32,), args)
    with pytest.raises(ValueError, match="differ from launch_config"):
        launch((3,), (96,), args)
    assert np.isnan(out).all()
    launch((4,), (96,), args)
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
