"""CosineEmbeddingLossFused: the Kernel for kernels/cosine_embedding_loss_fused.cu."""

from cek.cosine_embedding_loss_backward import MATRIX, ROW
from cek.kernel import Arg, Kernel


class CosineEmbeddingLossFused(Kernel):
    """Per-row loss and dx1, dx2 from one read of x1 and x2.

    The upstream gradient of row r is `scale * dy[r]`, or `scale` alone when dy is None: mean
    (scale = 1/n_rows) and sum (scale = 1) need no dy array.
    """

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

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu, without dy (the mean/sum case a training step takes).
        return 16 * n_rows * n_dim + 8 * n_rows
