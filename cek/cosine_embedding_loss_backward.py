"""CosineEmbeddingLossBackward: the Kernel for kernels/cosine_embedding_loss_backward.cu."""

from cek.kernel import Arg, Kernel, RowGroups

ROW = ("n_rows",)
MATRIX = ("n_rows", "n_dim")


class CosineEmbeddingLossBackward(Kernel):
    """dx1, dx2 of the per-row cosine embedding loss, given the upstream gradient dy [n_rows]."""

    name = "cosine_embedding_loss_backward"
    short_name = "backward"
    kind = "backward"
    args = (
        Arg("dy", "A*", ROW),
        Arg("x1", "T*", MATRIX),
        Arg("x2", "T*", MATRIX),
        Arg("y", "A*", ROW),
        Arg("dx1", "T*", MATRIX, output=True),
        Arg("dx2", "T*", MATRIX, output=True),
        Arg("n_rows", "int"),
        Arg("n_dim", "int"),
        Arg("margin", "A"),
    )

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu: x1, x2 read and dx1, dx2 written once, plus dy and y; a streamed
        # row is read twice.
        return self._io_bytes(n_rows, n_dim, 6 if self.streamed else 4, 2)


class CosineEmbeddingLossBackwardRows(RowGroups, CosineEmbeddingLossBackward):
    """The backward kernel with several rows per block where rows are narrow (float: n_dim <=
    256); the same arguments and results. Faster there, but its grid is not [n_rows, 1, 1]."""

    name = "cosine_embedding_loss_backward_rows"
    short_name = "backward-rows"
    source_file = "cosine_embedding_loss_backward.cu"
    twin = CosineEmbeddingLossBackward


class CosineEmbeddingLossBackwardKeep(CosineEmbeddingLossBackwardRows):
    """The _rows variant that leaves alone the rows whose gradient is already in dx1 and dx2:
    a row whose dy equals `keep_dy` reads only its dy and writes nothing; a NaN keep_dy keeps
    no row (the _rows kernel's results). cek.torch runs it after the fused kernel's forward,
    with keep_dy = the fused kernel's scale, so an upstream gradient of 1 costs O(N) bytes."""

    name = "cosine_embedding_loss_backward_keep"
    short_name = "backward-keep"
    args = CosineEmbeddingLossBackward.args + (Arg("keep_dy", "A"),)
