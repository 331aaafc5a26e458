"""The backward-keep kernel on the CPU emulator: rows whose dy equals keep_dy are left exactly as
they were in dx1 and dx2, every other row gets the backward kernel's gradients.

dx1 and dx2 are prefilled with a sentinel, so a kept row that the kernel wrote, or a recomputed
row it forgot, fails. Row groups (narrow rows), one block per row and a streamed row each run.
"""

import numpy as np
import pytest

from cek import check, dtypes
from cek.cosine_embedding_loss_backward import CosineEmbeddingLossBackwardKeep

pytestmark = pytest.mark.emulator
SENTINEL = 7.0
N = 9


@pytest.fixture(scope="module")
def launch():
    pytest.importorskip("cek.emulate")
    return check.emulator_launcher(schedule="random:3")


@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("n_dim", [33, 769, 16385])
def test_kept_rows_are_untouched_and_the_others_recomputed(launch, dtype, n_dim):
    kernel = CosineEmbeddingLossBackwardKeep.for_n_dim(n_dim, dtype)
    inputs = check.make_inputs(N, n_dim, seed=n_dim, dtype=dtype)
    keep = inputs["dy"].dtype.type(0.125)
    kept = np.arange(N) % 3 == 1  # rows 1, 4, 7, in different lanes, blocks and groups
    inputs["dy"][kept] = keep
    inputs["keep_dy"] = float(keep)
    args, outputs = check.build_args(kernel, inputs, 0.1)
    for name in ("dx1", "dx2"):
        outputs[name][...] = dtypes.from_float(np.full((N, n_dim), SENTINEL, np.float32), dtype)
    launch(kernel, args)

    want, size = check.expected(kernel, inputs, 0.1)
    for name in ("dx1", "dx2"):
        got = dtypes.to_float64(outputs[name], dtype)
        assert (got[kept] == SENTINEL).all(), f"{name}: a kept row was written"
        rest = {name: outputs[name][~kept]}
        _, _, failures = check.compare(rest, {name: want[name][~kept]},
                                       {name: size[name][~kept]}, dtype)
        assert not failures, failures


def test_a_nan_keep_dy_keeps_no_row_and_a_nan_dy_is_recomputed(launch):
    kernel = CosineEmbeddingLossBackwardKeep.for_n_dim(40)
    inputs = check.make_inputs(N, 40, seed=1)
    assert inputs["y"][3] == 1  # a label whose gradient is -dy
    inputs["dy"][3] = np.nan
    for keep in (float("nan"), 0.125):
        inputs["keep_dy"] = keep
        args, outputs = check.build_args(kernel, inputs, 0.0)
        launch(kernel, args)
        assert np.isnan(outputs["dx1"][3]).all()  # NaN dy: NaN gradient, never kept
        assert not np.isnan(np.delete(outputs["dx1"], 3, axis=0)).any()  # every other row written


@pytest.mark.parametrize("n_dim", [33, 769, 16385])
def test_kept_rows_read_only_their_dy(n_dim):
    """Counted byte by byte: with every row kept, x1, x2 and y are not read and dx1, dx2 not
    written (the O(N) step of an upstream gradient of 1); with none kept, the whole backward."""
    emulate = pytest.importorskip("cek.emulate")
    kernel = CosineEmbeddingLossBackwardKeep.for_n_dim(n_dim)
    inputs = check.make_inputs(N, n_dim, seed=2)
    for keep, rows in ((0.125, "all"), (float("nan"), "none")):
        if rows == "all":
            inputs["dy"][:] = np.float32(keep)
        inputs["keep_dy"] = keep
        args, _ = check.build_args(kernel, inputs, 0.0)
        grid, block, smem = kernel.launch_config(N, n_dim)
        counts = emulate.traffic(kernel, grid, block, args, shared_mem=smem)
        assert counts["dy"].read == counts["dy"].size
        for name in ("x1", "x2", "y", "dx1", "dx2"):
            touched = counts[name].read + counts[name].written  # bytes, each counted once
            assert touched == (0 if rows == "all" else counts[name].size), (rows, name)
