"""CosineEmbeddingLossForward: the Kernel for kernels/cosine_embedding_loss_forward.cu."""

from cek.cosine_embedding_loss_backward import MATRIX, ROW
from cek.kernel import Arg, Kernel


class CosineEmbeddingLossForward(Kernel):
    """The per-row cosine embedding loss out [n_rows]."""

    name = "cosine_embedding_loss_forward"
    args = (
        Arg("x1", "float*", MATRIX),
        Arg("x2", "float*", MATRIX),
        Arg("y", "float*", ROW),
        Arg("out", "float*", ROW, output=True),
        Arg("n_rows", "int"),
        Arg("n_dim", "int"),
        Arg("margin", "float"),
    )

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu: x1, x2 read once, y read and out written.
        return 8 * n_rows * n_dim + 8 * n_rows
