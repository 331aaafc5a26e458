"""CosineEmbeddingLossForward: the Kernel for kernels/cosine_embedding_loss_forward.cu."""

from cek.cosine_embedding_loss_backward import MATRIX, ROW
from cek.kernel import Kernel
from cek.kernel_args import Arg
from cek.tiling import RowGroups


class CosineEmbeddingLossForward(Kernel):
    """The per-row cosine embedding loss out [n_rows]."""

    name = "cosine_embedding_loss_forward"
    short_name = "forward"
    kind = "forward"
    args = (
        Arg("x1", "T*", MATRIX),
        Arg("x2", "T*", MATRIX),
        Arg("y", "A*", ROW),
        Arg("out", "A*", ROW, output=True),
        Arg("n_rows", "int"),
        Arg("n_dim", "int"),
        Arg("margin", "A"),
    )

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu: x1, x2 read once, y read and out written.
        return self._io_bytes(n_rows, n_dim, 2, 2)


class CosineEmbeddingLossForwardRows(RowGroups, CosineEmbeddingLossForward):
    """The forward kernel with several rows per block where rows are narrow (float: n_dim <=
    256); the same arguments and results. Faster there, but its grid is not [n_rows, 1, 1]."""

    name = "cosine_embedding_loss_forward_rows"
    short_name = "forward-rows"
    source_file = "cosine_embedding_loss_forward.cu"
    twin = CosineEmbeddingLossForward
