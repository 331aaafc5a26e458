"""The backward-keep kernel on the CPU emulator: rows whose dy is 1 are left exactly as they were
in dx1 and dx2, every other row gets the backward-rows kernel's gradients, bit for bit, whatever
the grid (a wave of blocks each taking an even share of the rows).

dx1 and dx2 are prefilled with a sentinel, so a kept row that the kernel wrote, or a recomputed
row it forgot, fails. Row groups (narrow rows), one block per row and a streamed row each run.
"""

import numpy as np
import pytest

from cek import check, dtypes
from cek.cosine_embedding_loss_backward import (CosineEmbeddingLossBackwardKeep,
                                                CosineEmbeddingLossBackwardRows)

pytestmark = pytest.mark.emulator
SENTINEL = 7.0
N = 9


@pytest.fixture(scope="module")
def emulate():
    return pytest.importorskip("cek.emulate")


def _sentinels(outputs, n, n_dim, dtype):
    for name in ("dx1", "dx2"):
        outputs[name][...] = dtypes.from_float(np.full((n, n_dim), SENTINEL, np.float32), dtype)


def _run(emulate, kernel, inputs, margin, grid=None, sentinel=True):
    """The kernel on `inputs` with dx1, dx2 prefilled with SENTINEL, on `grid` blocks (default:
    a block a row, or a row group)."""
    n, n_dim = inputs["x1"].shape
    args, outputs = check.build_args(kernel, inputs, margin)
    if sentinel:
        _sentinels(outputs, n, n_dim, kernel.dtype)
    (most, _, _), block, smem = kernel.launch_config(n, n_dim)
    emulate.load(kernel, schedule="random:3")((grid or most,), block, args, shared_mem=smem)
    return outputs


def _ones(dtype, shape=()):
    return dtypes.from_float(np.ones(shape, np.float32), dtype)


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("n_dim", [33, 769, 16385])
def test_kept_rows_are_untouched_and_the_others_recomputed(emulate, dtype, n_dim):
    kernel = CosineEmbeddingLossBackwardKeep.for_n_dim(n_dim, dtype)
    inputs = check.make_inputs(N, n_dim, seed=n_dim, dtype=dtype)
    kept = np.arange(N) % 3 == 1  # rows 1, 4, 7, in different lanes, blocks and groups
    inputs["dy"][kept] = _ones(dtype)
    inputs["scale"] = 0.25  # a mean's 1/N: kept rows are those whose dy is 1 itself
    outputs = _run(emulate, kernel, inputs, 0.1)

    want, size = check.expected(kernel, inputs, 0.1)
    for name in ("dx1", "dx2"):
        got = dtypes.to_float64(outputs[name], dtype)
        assert (got[kept] == SENTINEL).all(), f"{name}: a kept row was written"
        rest = {name: outputs[name][~kept]}
        _, _, failures = check.compare(rest, {name: want[name][~kept]},
                                       {name: size[name][~kept]}, dtype)
        assert not failures, failures


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n_dim", [8, 33, 256, 769])
@pytest.mark.parametrize("grid", [1, 2, 3, 5])
def test_any_grid_gives_the_backward_kernels_bits(emulate, dtype, n_dim, grid):
    """A wave grid: G blocks take an even share of the rows each (several trips of a row
    group's dy, or rows one after another), and every recomputed row is the backward-rows
    kernel's bit for bit; kept rows keep their sentinel."""
    keep = CosineEmbeddingLossBackwardKeep.for_n_dim(n_dim, dtype)
    rows = CosineEmbeddingLossBackwardRows.for_n_dim(n_dim, dtype)
    n = 1100 if keep.grouped else 70  # rows for five blocks of row groups of 2 lanes, and more
    inputs = check.make_inputs(n, n_dim, seed=grid, dtype=dtype)
    kept = np.arange(n) % 5 == 2
    inputs["dy"][kept] = _ones(dtype)
    assert grid <= keep.launch_config(n, n_dim)[0][0]
    got = _run(emulate, keep, inputs, -0.2, grid=grid)
    want = _run(emulate, rows, inputs, -0.2, sentinel=False)
    for name in ("dx1", "dx2"):
        g, w = dtypes.to_float64(got[name], dtype), dtypes.to_float64(want[name], dtype)
        assert (g[kept] == SENTINEL).all()
        assert np.array_equal(got[name][~kept], want[name][~kept]), name


@pytest.mark.parametrize("n_dim", [33, 769])
@pytest.mark.parametrize("dy, kept", [(1.0, True), (3.0, False)])
def test_one_dy_for_every_row(emulate, n_dim, dy, kept):
    """dy_stride 0: a mean's or a sum's 0-d gradient, read in place. At 1 every row keeps the
    fused kernel's gradients; at 3 every row is recomputed for 3 * scale."""
    kernel = CosineEmbeddingLossBackwardKeep.for_n_dim(n_dim)
    inputs = check.make_inputs(N, n_dim, seed=4)
    inputs["dy"] = np.asarray(np.float32(dy))
    inputs["dy_stride"], inputs["scale"] = 0, 1 / N
    outputs = _run(emulate, kernel, inputs, 0.0, grid=min(2, kernel.launch_config(N, n_dim)[0][0]))
    if kept:
        for name in ("dx1", "dx2"):
            assert (outputs[name] == SENTINEL).all()
        return
    want, size = check.expected(kernel, inputs, 0.0)
    _, _, failures = check.compare({k: outputs[k] for k in want}, want, size)
    assert not failures, failures


def test_a_nan_dy_is_recomputed(emulate):
    kernel = CosineEmbeddingLossBackwardKeep.for_n_dim(40)
    inputs = check.make_inputs(N, 40, seed=1)
    assert inputs["y"][3] == 1  # a label whose gradient is -dy
    inputs["dy"][3] = np.nan
    outputs = _run(emulate, kernel, inputs, 0.0)
    assert np.isnan(outputs["dx1"][3]).all()  # NaN dy: NaN gradient, never kept
    assert not np.isnan(np.delete(outputs["dx1"], 3, axis=0)).any()  # every other row written


@pytest.mark.parametrize("n_dim", [33, 769, 16385])
def test_kept_rows_read_only_their_dy(emulate, n_dim):
    """Counted byte by byte: with every row kept, x1, x2 and y are not read and dx1, dx2 not
    written (the O(N) step of an upstream gradient of 1); with one dy for every row at 1, each
    block reads that one value and nothing else; with none kept, the whole backward."""
    kernel = CosineEmbeddingLossBackwardKeep.for_n_dim(n_dim)
    inputs = check.make_inputs(N, n_dim, seed=2)
    grid = min(2, kernel.launch_config(N, n_dim)[0][0])
    for case in ("per row", "one", "none kept"):
        if case == "per row":
            inputs["dy"][:] = 1.0
        elif case == "one":
            inputs["dy"], inputs["dy_stride"] = np.ones((), np.float32), 0
        else:
            inputs["dy"], inputs["dy_stride"] = np.full(N, 0.5, np.float32), 1
        args, _ = check.build_args(kernel, inputs, 0.0)
        block, smem = kernel.launch_config(N, n_dim)[1:]
        counts = emulate.traffic(kernel, (grid,), block, args, shared_mem=smem)
        assert counts["dy"].read == counts["dy"].size
        for name in ("x1", "x2", "y", "dx1", "dx2"):
            touched = counts[name].read + counts[name].written  # bytes, each counted once
            assert touched == (counts[name].size if case == "none kept" else 0), (case, name)
