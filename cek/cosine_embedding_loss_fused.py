"""CosineEmbeddingLossFused: the Kernel for kernels/cosine_embedding_loss_fused.cu."""

from cek.cosine_embedding_loss_backward import MATRIX, ROW
from cek.kernel import Arg, Kernel, RowGroups


class CosineEmbeddingLossFused(RowGroups, Kernel):
    """Per-row loss and dx1, dx2 from one read of x1 and x2.

    The upstream gradient of row r is `scale * dy[r]`, or `scale` alone when dy is None: mean
    (scale = 1/n_rows) and sum (scale = 1) need no dy array. Rows of up to 64 chunks and 256
    elements (256 floats or halves, 128 doubles) run in row groups: a warp or less per row,
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
        Arg("dy", "A*", ROW, optional=True),
        Arg("scale", "A"),
        Arg("loss", "A*", ROW, output=True),
        Arg("dx1", "T*", MATRIX, output=True),
        Arg("dx2", "T*", MATRIX, output=True),
        Arg("n_rows", "int"),
        Arg("n_dim", "int"),
        Arg("margin", "A"),
    )

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu, without dy (the mean/sum case a training step takes).
        return self._io_bytes(n_rows, n_dim, 6 if self.streamed else 4, 2)
