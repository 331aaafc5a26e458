"""CosineEmbeddingLossFused: the Kernel for kernels/cosine_embedding_loss_fused.cu."""

import math

from cek.cosine_embedding_loss_backward import MATRIX, ROW
from cek.kernel import Arg, Kernel

# Mirrors of kernels/cek_row.cuh: up to BLOCK_SIZE 256, GROUP lanes of a 256-thread block per row.
MAX_GROUPED_BLOCK = 256
GROUPED_THREADS = 256


class CosineEmbeddingLossFused(Kernel):
    """Per-row loss and dx1, dx2 from one read of x1 and x2.

    The upstream gradient of row r is `scale * dy[r]`, or `scale` alone when dy is None: mean
    (scale = 1/n_rows) and sum (scale = 1) need no dy array. Rows up to 256 wide run in row
    groups: a warp or less per row, several rows per block.
    """

    launch_contract = (
        "BLOCK_SIZE = next_power_of_two(n_dim). BLOCK_SIZE <= 256: 256 threads a block, "
        "GROUP = min(32, BLOCK_SIZE/4) lanes per row, grid [ceil(n_rows / (256/GROUP)), 1, 1]. "
        "Above: as the backward kernel, grid [n_rows, 1, 1], one block per row"
    )

    name = "cosine_embedding_loss_fused"
    args = (
        Arg("x1", "float*", MATRIX),
        Arg("x2", "float*", MATRIX),
        Arg("y", "float*", ROW),
        Arg("dy", "float*", ROW, optional=True),
        Arg("scale", "float"),
        Arg("loss", "float*", ROW, output=True),
        Arg("dx1", "float*", MATRIX, output=True),
        Arg("dx2", "float*", MATRIX, output=True),
        Arg("n_rows", "int"),
        Arg("n_dim", "int"),
        Arg("margin", "float"),
    )

    @property
    def group(self) -> int:
        """Lanes per row on the row-group path."""
        return min(32, max(1, self.block_size // 4))

    def _grid_and_block(self, n_rows: int, n_dim: int) -> tuple[tuple, tuple]:
        if self.block_size > MAX_GROUPED_BLOCK:
            return super()._grid_and_block(n_rows, n_dim)
        rows_per_block = GROUPED_THREADS // self.group
        return (math.ceil(n_rows / rows_per_block), 1, 1), (GROUPED_THREADS, 1, 1)

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu, without dy (the mean/sum case a training step takes).
        return (24 if self.streamed else 16) * n_rows * n_dim + 8 * n_rows
