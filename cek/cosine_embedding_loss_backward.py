"""CosineEmbeddingLossBackward: the Kernel for kernels/cosine_embedding_loss_backward.cu."""

from cek import dtypes
from cek.kernel import Kernel
from cek.kernel_args import Arg
from cek.tiling import SM_THREADS, RowGroups, WaveGrid

ROW = ("n_rows",)
MATRIX = ("n_rows", "n_dim")


def upstream(optional: bool) -> tuple[Arg, ...]:
    """The upstream gradient of row r, scale * dy[r * dy_stride]: dy in the inputs' type T, as
    torch's gradient of a loss of that type is; dy_stride 0 reads one value for every row (a
    mean's or a sum's 0-d gradient, in place), 1 one a row. `optional`: dy may be None, for an
    upstream gradient of 1 (the fused kernels; a backward kernel always has a gradient)."""
    return (Arg("dy", "T*", ROW, optional=optional, stride="dy_stride"),
            Arg("dy_stride", "int"),
            Arg("scale", "A"))


# What every backward kernel takes after its upstream gradient.
ROWS_AND_GRADIENTS = (
    Arg("x1", "T*", MATRIX),
    Arg("x2", "T*", MATRIX),
    Arg("y", "A*", ROW),
    Arg("dx1", "T*", MATRIX, output=True),
    Arg("dx2", "T*", MATRIX, output=True),
    Arg("n_rows", "int"),
    Arg("n_dim", "int"),
    Arg("margin", "A"),
)


class CosineEmbeddingLossBackward(Kernel):
    """dx1, dx2 of the per-row cosine embedding loss for the upstream gradient dy [n_rows], one
    value a row. Its launch tuple is the documented contract and never changes: (dy, x1, x2, y,
    dx1, dx2, n_rows, n_dim, margin); cek's launchers run the _rows and _keep variants, which
    read the upstream gradient in place with a stride and a scale."""

    name = "cosine_embedding_loss_backward"
    short_name = "backward"
    kind = "backward"
    args = (Arg("dy", "T*", ROW), *ROWS_AND_GRADIENTS)

    @property
    def min_blocks_from_sm100(self) -> int:
        """3/4 of an SM's threads where min_blocks asks all of them (32 registers; blocks of 1024
        threads, which 3/4 does not divide, one an SM: 64): at 32, ptxas for sm_100 and sm_103
        (NVRTC 13.5) spilled 4 to 28 bytes of the float rows of 8192 and the 16-bit rows of 768
        and 8192, which sm_80 and sm_90 fit."""
        if self.min_blocks * self.max_threads < SM_THREADS:
            return self.min_blocks
        return max(1, SM_THREADS * 3 // 4 // self.max_threads)

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu: x1, x2 read and dx1, dx2 written once (a streamed row read
        # twice), y, and a dy a row.
        return self._io_bytes(n_rows, n_dim, 6 if self.streamed else 4, 1) + \
            self._io_bytes(n_rows, 1, 1, 0)


class CosineEmbeddingLossBackwardRows(RowGroups, CosineEmbeddingLossBackward):
    """The backward kernel with several rows per block where rows are narrow (float: n_dim <=
    256), and the upstream gradient of row r read in place: scale * dy[r * dy_stride]
    (upstream), so a mean's or a sum's 0-d gradient needs no expanded copy. With dy_stride 1 and
    scale 1, the backward kernel's results; its grid is not [n_rows, 1, 1] for narrow rows."""

    name = "cosine_embedding_loss_backward_rows"
    short_name = "backward-rows"
    source_file = "cosine_embedding_loss_backward.cu"
    twin = CosineEmbeddingLossBackward
    args = (*upstream(optional=False), *ROWS_AND_GRADIENTS)


class CosineEmbeddingLossBackwardKeep(WaveGrid, CosineEmbeddingLossBackwardRows):
    """The _rows variant for dx1 and dx2 that hold the gradients for an upstream gradient of 1
    already (cek.torch's training step runs the fused kernel in the forward): a row whose dy is
    1 is left as it is, every other row is recomputed. A grid of at most one wave (WaveGrid):
    with one dy for every row (dy_stride 0, or no dy) at 1, each block reads it and returns, so
    the backward of `loss.backward()` on a mean or sum costs a wave of blocks, whatever N."""

    name = "cosine_embedding_loss_backward_keep"
    short_name = "backward-keep"

    @property
    def min_blocks(self) -> int:
        """The backward-rows kernel's rule, but at most 3/4 of an SM's threads (40 registers
        where it fits 32), half for double rows and 16-bit row groups (64 registers, below):
        the loop over a block's rows keeps state live beside a row's work,
        which at 32 spilled the float row groups and the tailed float and bfloat16 rows on
        sm_80. A recomputed row keeps its one load round, and the bytes in flight an SM stay
        above what Little's law asks (tests/test_static_targets.py)."""
        # Half for double rows and 16-bit row groups (64 registers): at 40, sm_120 (NVRTC 13.5)
        # took a 16-byte stack for double rows of 768, and 16-bit row groups spilled 8 bytes on
        # sm_70 (12.9), sm_80 or sm_120 (13.5) by the order of the loop's statements.
        itemsize = dtypes.get(self.dtype).array.itemsize
        share = 2 if itemsize == 8 or (itemsize == 2 and self.grouped) else 3
        return min(super().min_blocks, max(1, SM_THREADS * share // 4 // self.max_threads))

    launch_contract = ("the backward-rows kernel's block; grid [G, 1, 1] with 1 <= G <= U, "
                       "the backward-rows kernel's grid (cek's launchers: min(U, min_blocks * "
                       "SMs)), block b taking its units (rows, or row groups) [b*U/G, "
                       "(b+1)*U/G)")
