"""The split kernels of kernels/cosine_embedding_loss_split.cu: few wide rows over many blocks.

A row of D elements is cut into `slices(n_dim, dtype)` slices of `slice_width(dtype)` elements
(4096 floats, 8192 16-bit values, 2048 doubles: one 16-byte chunk for each of 1024 threads,
loaded in one round). Each result is two launches, a pair: CosineEmbeddingLossSplitSums writes
every slice's partial sums into a workspace, then the kernel of the result (forward, backward,
fused, backward-keep) adds a row's partials in a fixed order in each of its blocks and, for the
gradients, reads its slice again.
`splits(n_rows, n_dim, dtype)` is where cek's functions and cek.torch run the pair instead of the
one-block-per-row kernel; it and the slices depend on N and D alone, so the bits do too.
"""

from __future__ import annotations

from cek import dtypes
from cek.cosine_embedding_loss_backward import (MATRIX, ROW, CosineEmbeddingLossBackward,
                                                CosineEmbeddingLossBackwardKeep)
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from cek.kernel import Arg, Kernel, _is_int, register_path_width

THREADS = 1024
ONE_BLOCK_MAX_N_DIM = 1 << 20  # the widest row of the one-block-per-row kernels
# The split runs below this many rows of the streamed path (more than 16384 elements, 8192
# doubles). There one block per row holds 56 to 62 registers a thread, one block of 1024 an
# SM: 48 rows fill 0.36 waves of an H200's 132 SMs, 256 rows 1.94 waves (two, the second 94%
# full). The split, at two blocks an SM (one for the gradient kernels in double) and S blocks
# a row, fills waves from a few rows on, for one more launch and the partials; but a gradient
# pair reads each slice again after every slice was read once, from DRAM where x1 and x2 pass
# L2's size, where one block reads its row again at once, from L2. From 512 rows (3.9 waves)
# the one-block-per-row kernel keeps the GPU busy and its second read cheap, so it runs there
# (docs/design.md, "Wide rows, few of them"; a GPU run is to say where the two meet). A
# constant, not the device's SM count: the choice sets the order of the additions, so the bits.
SPLIT_BELOW_ROWS = 512
SUMS = ("n_rows", "n_dim")  # what a workspace of partials depends on (Kernel.derived_shape)
CHUNKS = 1  # CekSplit<T>::CHUNKS: the chunk pairs of a slice each thread holds
# The widest row one block a row holds in registers, by dtype: the streamed path is above it.
_STREAMED_ABOVE = {name: register_path_width(name) for name in dtypes.DTYPES}


def slice_width(dtype: str) -> int:
    """CekSplit<T>::SLICE: elements of a slice, 1024 threads x CHUNKS chunks of 16 bytes."""
    return THREADS * CHUNKS * dtypes.get(dtype).vec


def slices(n_dim: int, dtype: str) -> int:
    """Slices of a row of n_dim elements: S = ceil(n_dim / slice_width)."""
    return -(-int(n_dim) // slice_width(dtype))


def partials_shape(n_rows: int, n_dim: int, dtype: str) -> tuple[int, int]:
    """The shape of the partial sums of an n_rows x n_dim problem: [n_rows * S, 4] of the
    accumulation dtype (sq1, sq2, dot, far), the workspace a pair's two launches share."""
    return (n_rows * slices(n_dim, dtype), 4)


def max_n_dim(dtype: str) -> int:
    """The widest row the split takes: 1024 slices, one partial for each thread of a block
    (2^22 floats, 2^23 16-bit values, 2^21 doubles)."""
    return THREADS * slice_width(dtype)


def splits(n_rows: int, n_dim: int, dtype: str) -> bool:
    """Whether cek's launchers run the split pair for an n_rows x n_dim problem: rows the
    one-block-per-row kernels stream (cek_row.cuh), fewer than SPLIT_BELOW_ROWS of them, and
    rows wider than those kernels take (2^20), however many."""
    if n_dim > ONE_BLOCK_MAX_N_DIM:
        return True
    # comparisons and a lookup: torch.compile traces this (cek.torch's checks) with symbolic
    # sizes, and cek.torch asks on every step
    return 1 <= n_rows < SPLIT_BELOW_ROWS and n_dim > _STREAMED_ABOVE[dtype]


def blocks_per_row(n_rows: int, n_dim: int, dtype: str) -> int:
    """Blocks a row takes in cek's launches: S where they split it, else 1."""
    return slices(n_dim, dtype) if splits(n_rows, n_dim, dtype) else 1


class SplitRows:
    """Mixin of the split kernels: 1024 threads a block (BLOCK_SIZE), one instance per dtype
    for rows of any width up to max_n_dim, a block per slice (`per_slice`) or per row."""

    max_block_size = THREADS
    source_file = "cosine_embedding_loss_split.cu"
    per_slice = True  # grid [n_rows * S]; the forward's second launch: [n_rows]
    launch_contract = ("block [1024, 1, 1]; a row of n_dim elements is S = ceil(n_dim / SLICE) "
                       "slices (SLICE: 4096 floats, 8192 16-bit values, 2048 doubles); grid "
                       "[n_rows * S, 1, 1], a block a slice")

    def __init__(self, block_size: int = THREADS, dtype: str = "f32"):
        super().__init__(block_size, dtype)
        if self.block_size != THREADS:
            raise ValueError(f"{self.name} runs {THREADS} threads: block_size must be {THREADS}, "
                             f"got {block_size}")

    @classmethod
    def for_dtype(cls, dtype: str = "f32"):
        """The one instance of this kernel in `dtype`."""
        return cls(THREADS, dtype)

    @classmethod
    def for_n_dim(cls, n_dim: int, dtype: str = "f32"):
        """The instance for rows of n_dim elements: one per dtype, for every width it takes."""
        top = max_n_dim(dtype)
        if not _is_int(n_dim) or not 1 <= n_dim <= top:
            raise ValueError(f"n_dim must be an int in [1, {top}] for {cls.name} in {dtype}, "
                             f"got {n_dim!r}")
        return cls(THREADS, dtype)

    @classmethod
    def block_sizes(cls) -> list[int]:
        return [THREADS]

    @property
    def max_threads(self) -> int:
        return THREADS

    @property
    def chunks_held(self) -> int:
        return CHUNKS

    @property
    def min_blocks(self) -> int:
        """Two blocks of 1024 an SM (32 registers), but one for the gradient kernels in double
        (40 to 48 registers). tests/test_compile.py holds every one to 0 spills."""
        double = dtypes.get(self.dtype).array.itemsize == 8
        return 1 if double and self.kind in ("backward", "fused") else 2

    @property
    def slice_width(self) -> int:
        return slice_width(self.dtype)

    def slices(self, n_dim: int) -> int:
        return slices(n_dim, self.dtype)

    def _tiling_asserts(self) -> str:
        """static_asserts that CekSplit (the .cu) has this class's slice."""
        split = f"CekSplit<{dtypes.get(self.dtype).c_type}>"
        facts = {"THREADS": THREADS, "CHUNKS": self.chunks_held, "SLICE": self.slice_width}
        return "".join(
            f'static_assert({split}::{name} == {value}, "cek/cosine_embedding_loss_split.py and '
            f'CekSplit disagree on {name}");\n' for name, value in facts.items())

    def launch_config(self, n_rows: int, n_dim: int) -> tuple[tuple, tuple, int]:
        for name, value, top in (("n_rows", n_rows, 2**31 - 1),
                                 ("n_dim", n_dim, max_n_dim(self.dtype))):
            if not _is_int(value) or not 1 <= value <= top:
                raise ValueError(f"{name} must be an int in [1, {top}], got {value!r}")
        blocks = int(n_rows) * (self.slices(n_dim) if self.per_slice else 1)
        if blocks >= 2**31:
            raise ValueError(f"{n_rows} rows of {self.slices(n_dim)} slices are {blocks} blocks, "
                             f"more than a grid takes (2^31 - 1)")
        return (blocks, 1, 1), (THREADS, 1, 1), 0

    def derived_shape(self, spec: Arg, n_rows: int, n_dim: int) -> tuple[int, ...]:
        """The partials (partials_shape): the one derived argument, `sums`."""
        return partials_shape(n_rows, n_dim, self.dtype)

    def derived_rule(self, spec: Arg) -> str:
        return f"(n_rows * ceil(n_dim / {self.slice_width}), 4)"

    def workspace_bytes(self, n_rows: int, n_dim: int) -> int:
        """Bytes of the partials of an n_rows x n_dim problem."""
        rows, width = partials_shape(n_rows, n_dim, self.dtype)
        return rows * width * dtypes.get(self.dtype).acc.itemsize


def _sums_arg(output: bool) -> Arg:
    return Arg("sums", "CekSliceSums<A>*", SUMS, output=output, derived=True)


class CosineEmbeddingLossSplitSums(SplitRows, Kernel):
    """The first launch of every split pair: block r*S + s writes the partial sums of slice s
    of row r, sums[r*S + s] = (sq1, sq2, dot, far), reading x1 and x2 once."""

    name = "cosine_embedding_loss_split_sums"
    short_name = "split-sums"
    kind = "sums"
    args = (
        Arg("x1", "T*", MATRIX),
        Arg("x2", "T*", MATRIX),
        _sums_arg(output=True),
        Arg("n_rows", "int"),
        Arg("n_dim", "int"),
    )

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu: x1, x2 read once, the partials written.
        return self._io_bytes(n_rows, n_dim, 2, 0) + self.workspace_bytes(n_rows, n_dim)


class _Second(SplitRows):
    """A second launch: it reads the partials CosineEmbeddingLossSplitSums wrote."""

    first = CosineEmbeddingLossSplitSums
    launch_contract = SplitRows.launch_contract + "; after split-sums, whose partials it reads"


class CosineEmbeddingLossSplitForward(_Second, Kernel):
    """The per-row loss out [n_rows] from the partials: one block a row."""

    name = "cosine_embedding_loss_split_forward"
    short_name = "forward-split"
    kind = "forward"
    per_slice = False
    launch_contract = ("block [1024, 1, 1]; grid [n_rows, 1, 1], a block a row; after "
                       "split-sums, whose partials it reads")
    args = (
        Arg("y", "A*", ROW),
        _sums_arg(output=False),
        Arg("out", "A*", ROW, output=True),
        Arg("n_rows", "int"),
        Arg("n_dim", "int"),
        Arg("margin", "A"),
    )

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu: the partials, y read and out written.
        return self._io_bytes(n_rows, n_dim, 0, 2) + self.workspace_bytes(n_rows, n_dim)


def _with_sums(args: tuple[Arg, ...], after: str) -> tuple[Arg, ...]:
    """A one-block kernel's arguments with the partials read after `after`: the split's kernel
    of the same result takes what it takes, in its order."""
    at = [a.name for a in args].index(after) + 1
    return (*args[:at], _sums_arg(output=False), *args[at:])


class _Gradients(_Second):
    """A second launch that reads its slice again and writes dx1 and dx2."""

    def bytes_moved(self, n_rows: int, n_dim: int) -> int:
        # Header of the .cu: x1, x2 read again, dx1, dx2 written, the partials; y and dy
        # (backward) or y and the loss (fused, without dy: the mean/sum case).
        return self._io_bytes(n_rows, n_dim, 4, 2) + self.workspace_bytes(n_rows, n_dim)


class CosineEmbeddingLossSplitBackward(_Gradients, Kernel):
    """dx1, dx2 for dy [n_rows] from the partials and a second read of each slice: the
    arguments of CosineEmbeddingLossBackward, the partials after y."""

    name = "cosine_embedding_loss_split_backward"
    short_name = "backward-split"
    kind = "backward"
    args = _with_sums(CosineEmbeddingLossBackward.args, after="y")


class CosineEmbeddingLossSplitBackwardKeep(CosineEmbeddingLossSplitBackward):
    """The split backward that leaves a row whose dy equals `keep_dy` as it is in dx1 and dx2,
    after reading only its dy (CosineEmbeddingLossBackwardKeep's contract): cek.torch's
    backward after the split fused forward, with the partials that forward left."""

    name = "cosine_embedding_loss_split_backward_keep"
    short_name = "backward-keep-split"
    args = _with_sums(CosineEmbeddingLossBackwardKeep.args, after="y")


class CosineEmbeddingLossSplitFused(_Gradients, Kernel):
    """Per-row loss and dx1, dx2 from the partials and a second read of each slice; row r's
    upstream gradient is scale * dy[r], or scale without dy: the arguments of
    CosineEmbeddingLossFused, the partials after scale."""

    name = "cosine_embedding_loss_split_fused"
    short_name = "fused-split"
    kind = "fused"
    args = _with_sums(CosineEmbeddingLossFused.args, after="scale")
