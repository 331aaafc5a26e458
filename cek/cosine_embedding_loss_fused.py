"""CosineEmbeddingLossFused: the Kernel for kernels/cosine_embedding_loss_fused.cu."""

import math

from cek.cosine_embedding_loss_backward import MATRIX, ROW
from cek.kernel import GROUPED_THREADS, MAX_GROUPED_CHUNKS, Arg, Kernel


class CosineEmbeddingLossFused(Kernel):
    """Per-row loss and dx1, dx2 from one read of x1 and x2.

    The upstream gradient of row r is `scale * dy[r]`, or `scale` alone when dy is None: mean
    (scale = 1/n_rows) and sum (scale = 1) need no dy array. Rows of up to 64 chunks (256
    floats) run in row groups: a warp or less per row, several rows per block.
    """

    launch_contract = (
        "BLOCK_SIZE = next_power_of_two(n_dim), VEC = 16/sizeof(T). Up to 64 chunks per row "
        "(float: BLOCK_SIZE <= 256): 256 threads a block, GROUP = min(32, BLOCK_SIZE/VEC) lanes "
        "per row, grid [ceil(n_rows / (256/GROUP)), 1, 1]. Above: as the backward kernel, "
        "grid [n_rows, 1, 1], one block per row"
    )

    name = "cosine_embedding_loss_fused"
    args = (
        Arg("x1", "T*", MATRIX),
        Arg("x2", "T*", MATRIX),
        Arg("y", "A*", ROW),
        Arg("dy", "A*", ROW, optional=True),
        Arg("scale", "A"),
        Arg("loss", "A*", ROW, output=True),
        Arg("dx1", "T*", MATRIX, output=True),
        Arg("dx2", "T*", MATRIX, output=True),
        Arg("n_rows", "int"),
        Arg("n_dim", "int"),
        Arg("margin", "A"),
    )

    @property
    def grouped(self) -> bool:
        return self.row_chunks <= MAX_GROUPED_CHUNKS

    @property
    def max_threads(self) -> int:
        """The block size the entry point promises in __launch_bounds__: row groups always run
        256 threads, which lets ptxas use more registers (at 1024 it spilled on sm_80)."""
        return GROUPED_THREADS if self.grouped else super().max_threads

    @property
    def group(self) -> int:
        """Lanes per row on the row-group path."""
        return min(32, self.row_chunks)

    def _grid_and_block(self, n_rows: int, n_dim: int) -> tuple[tuple, tuple]:
        if not self.grouped:
            return super()._grid_and_block(n_rows, n_dim)
        rows_per_block = GROUPED_THREADS // self.group
        return (math.ceil(n_rows / rows_per_block), 1, 1), (GROUPED_THREADS, 1, 1)

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu, without dy (the mean/sum case a training step takes).
        return self._io_bytes(n_rows, n_dim, 6 if self.streamed else 4, 2)
