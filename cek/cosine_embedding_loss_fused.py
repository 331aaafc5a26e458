"""CosineEmbeddingLossFused: the Kernel for kernels/cosine_embedding_loss_fused.cu."""

from cek import dtypes
from cek.cosine_embedding_loss_backward import MATRIX, ROW, upstream
from cek.kernel import Kernel
from cek.kernel_args import Arg
from cek.tiling import RowGroups


class CosineEmbeddingLossFused(RowGroups, Kernel):
    """Per-row loss and dx1, dx2 from one read of x1 and x2.

    The upstream gradient of row r is `scale * dy[r * dy_stride]` (dy in the inputs' type), or
    `scale` alone when dy is None: mean (scale = 1/n_rows) and sum (scale = 1) need no dy array.
    `loss` (the accumulation type: what the reduction reads) and `loss_out` (the inputs' type:
    reduction "none"'s result) are each written where given. `y_out`, when given, gets the
    labels as read, for a backward that recomputes rows later (cek.torch's training step,
    whose caller may refill its labels in between). Rows of up to 64 chunks and 256
    elements (256 floats or halves, 128 doubles), and 16-bit rows of 513..1024 (four chunk pairs
    a lane), run in row groups: a warp or less per row,
    several rows per block. A mean or sum of the loss is a second launch, of
    CosineEmbeddingLossReduce on the per-row `loss`.
    """

    name = "cosine_embedding_loss_fused"
    short_name = "fused"
    kind = "fused"
    args = (
        Arg("x1", "T*", MATRIX),
        Arg("x2", "T*", MATRIX),
        Arg("y", "A*", ROW),
        *upstream(optional=True),
        # The per-row losses in the accumulation type (what the reduction reads), and in the
        # inputs' type (reduction "none"'s result): each optional.
        Arg("loss", "A*", ROW, output=True, optional=True),
        Arg("dx1", "T*", MATRIX, output=True),
        Arg("dx2", "T*", MATRIX, output=True),
        Arg("loss_out", "T*", ROW, output=True, optional=True),
        # The labels as read, for a backward that recomputes rows later (optional).
        Arg("y_out", "A*", ROW, output=True, optional=True),
        Arg("n_rows", "int"),
        Arg("n_dim", "int"),
        Arg("margin", "A"),
    )

    @property
    def min_blocks_from_sm100(self) -> int:
        """Five blocks (48 registers) for 16-bit row groups of two chunk pairs a lane (rows of
        17..256 values), where min_blocks asks six (40): there sm_120's ptxas (NVRTC 13.5)
        spilled 4 to 8 bytes, which sm_80, sm_90 and sm_100 fit."""
        if self.grouped and self.chunks_held == 2 and dtypes.get(self.dtype).array.itemsize == 2:
            return min(self.min_blocks, 5)
        return self.min_blocks

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu, without dy, with loss and y_out: cek.torch's training step of a
        # mean or a sum (x1, x2 read, dx1, dx2 written, y read, loss and y_out written).
        return self._io_bytes(n_rows, n_dim, 6 if self.streamed else 4, 3)
