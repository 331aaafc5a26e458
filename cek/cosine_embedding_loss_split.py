"""The split kernels of kernels/cosine_embedding_loss_split.cu: few wide rows over many blocks.

A row of D elements is cut into `slices(n_dim, dtype)` slices of `slice_width(dtype)` elements
(4096 floats, 8192 16-bit values, 2048 doubles: one 16-byte chunk for each of 1024 threads,
loaded in one round). Each result is two launches, a pair: CosineEmbeddingLossSplitSums writes
every slice's partial sums into a workspace, then the kernel of the result (forward, backward,
fused, backward-keep) adds a row's partials in a fixed order in each of its blocks and, for the
gradients, reads its slice again.
`splits(n_rows, n_dim, dtype)` is the rule by which cek.plan runs the pair instead of the
one-block-per-row kernel, for cek's functions and cek.torch alike; it and the slices depend on
N and D alone, so the bits do too.
"""

from __future__ import annotations

from cek import dtypes, split_model
from cek.cosine_embedding_loss_backward import (MATRIX, ROW, CosineEmbeddingLossBackwardKeep,
                                                CosineEmbeddingLossBackwardRows)
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from cek.kernel import Kernel
from cek.kernel_args import Arg
from cek.tiling import WaveGrid, is_int, register_path_width

THREADS = 1024
ONE_BLOCK_MAX_N_DIM = 1 << 20  # the widest row of the one-block-per-row kernels
# The split is weighed for fewer rows than two waves of the one-block-per-row kernel, which
# holds one block of 1024 an SM on the streamed path: from there on it keeps every SM busy, and
# the split's one advantage left, the last of L2 its second read finds, is within the model's
# error. Below it cek.split_model decides, by the H200's figures: a few rows (their one block
# each cannot keep DRAM busy) and a nearly empty second wave split (docs/design.md, "Wide rows,
# few of them"). The model's constants, not the device's SM count: the choice sets the order
# of a row's additions, so its bits depend on N and D alone.
SPLIT_BELOW_ROWS = 2 * split_model.SMS
SUMS = ("n_rows", "n_dim")  # what a workspace of partials depends on (Kernel.derived_shape)
CHUNKS = 1  # CekSplit<T>::CHUNKS: the chunk pairs of a slice each thread holds
SUMS_SLICES = 2  # CekSplit<T>::SUMS_SLICES: the slices a block of the sums launch reads
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
    """Whether cek's launchers run the split pair for an n_rows x n_dim problem: rows wider than
    the one-block-per-row kernels take (2^20), however many; and rows they stream (cek_tiling.cuh),
    fewer than SPLIT_BELOW_ROWS of them, where cek.split_model finds the split faster."""
    if n_dim > ONE_BLOCK_MAX_N_DIM:
        return True
    if not 1 <= n_rows < SPLIT_BELOW_ROWS or n_dim <= _STREAMED_ABOVE[dtype]:
        return False
    return split_model.prefers_split(n_rows, n_dim, dtypes.get(dtype).array.itemsize)


def blocks_per_row(n_rows: int, n_dim: int, dtype: str) -> int:
    """The most blocks a row takes in cek's launches, for the grid's limit (2^31 - 1 blocks):
    S where every N splits (rows wider than 2^20), else 1: a split of fewer than
    SPLIT_BELOW_ROWS rows stays far below the limit. Comparisons only: torch.compile traces it
    (cek.torch's checks) with symbolic sizes."""
    return slices(n_dim, dtype) if n_dim > ONE_BLOCK_MAX_N_DIM else 1


class SplitRows:
    """Mixin of the split kernels: 1024 threads a block (BLOCK_SIZE), one instance per dtype
    for rows of any width up to max_n_dim, a block per slice (`per_slice`) or per row."""

    max_block_size = THREADS
    source_file = "cosine_embedding_loss_split.cu"
    per_slice = True  # grid [n_rows * S]; the forward's second launch: [n_rows]
    slices_per_block = 1  # the sums: SUMS_SLICES, grid [ceil(n_rows * S / SUMS_SLICES)]
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
        if not is_int(n_dim) or not 1 <= n_dim <= top:
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
        (40 to 48 registers) and for the keep kernel in 16-bit types, whose loop over its slices
        beside a 16-bit slice's conversions spilled 12 bytes at 32 registers on sm_80 and sm_90
        (40 unbounded). tests/test_compile.py holds every one to 0 spills."""
        itemsize = dtypes.get(self.dtype).array.itemsize
        if itemsize == 8 and self.kind in ("backward", "fused"):
            return 1
        return 1 if itemsize == 2 and getattr(self, "wave_grid", False) else 2

    @property
    def min_blocks_before_sm80(self) -> int:
        """One block an SM (64 registers) on sm_70 for the 16-bit gradient kernels, whose
        narrowing takes an instruction a value there, and for the double partial sums: at 32
        registers NVRTC 12.9 spilled 20 to 24 bytes and 4."""
        itemsize = dtypes.get(self.dtype).array.itemsize
        if (itemsize == 2 and self.kind in ("backward", "fused")) or \
                (itemsize == 8 and self.kind == "sums"):
            return 1
        return self.min_blocks

    @property
    def slice_width(self) -> int:
        return slice_width(self.dtype)

    def slices(self, n_dim: int) -> int:
        return slices(n_dim, self.dtype)

    def _tiling_asserts(self) -> str:
        """static_asserts that CekSplit (the .cu) has this class's slice."""
        split = f"CekSplit<{dtypes.get(self.dtype).c_type}>"
        facts = {"THREADS": THREADS, "CHUNKS": self.chunks_held, "SLICE": self.slice_width,
                 "SUMS_SLICES": SUMS_SLICES}
        return "".join(
            f'static_assert({split}::{name} == {value}, "cek/cosine_embedding_loss_split.py and '
            f'CekSplit disagree on {name}");\n' for name, value in facts.items())

    def launch_config(self, n_rows: int, n_dim: int) -> tuple[tuple, tuple, int]:
        for name, value, top in (("n_rows", n_rows, 2**31 - 1),
                                 ("n_dim", n_dim, max_n_dim(self.dtype))):
            if not is_int(value) or not 1 <= value <= top:
                raise ValueError(f"{name} must be an int in [1, {top}], got {value!r}")
        blocks = int(n_rows) * (self.slices(n_dim) if self.per_slice else 1)
        if blocks >= 2**31:
            raise ValueError(f"{n_rows} rows of {self.slices(n_dim)} slices are {blocks} blocks, "
                             f"more than a grid takes (2^31 - 1)")
        return (-(-blocks // self.slices_per_block), 1, 1), (THREADS, 1, 1), 0

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
    # CekSliceSums is alignas(16), read and written 16 bytes at a time: a misaligned workspace
    # would be a misaligned-address fault, which loses the process's CUDA context.
    return Arg("sums", "CekSliceSums<A>*", SUMS, output=output, derived=True, align=16)


class CosineEmbeddingLossSplitSums(SplitRows, Kernel):
    """The first launch of every split pair: the partial sums of slice s of row r,
    sums[r*S + s] = (sq1, sq2, dot, far), reading x1 and x2 once; block b reads slices 2b and
    2b + 1 of the N*S, all their loads in flight together, and sums each as if alone."""

    name = "cosine_embedding_loss_split_sums"
    short_name = "split-sums"
    kind = "sums"
    slices_per_block = SUMS_SLICES
    launch_contract = ("block [1024, 1, 1]; a row of n_dim elements is S = ceil(n_dim / SLICE) "
                       "slices (SLICE: 4096 floats, 8192 16-bit values, 2048 doubles); grid "
                       "[ceil(n_rows * S / 2), 1, 1], two slices a block")
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
        # Header of the .cu: x1, x2 read again, dx1, dx2 written, the partials, y; and a dy a
        # row (backward) or the loss and y_out (fused, without dy: the mean/sum case).
        rows = self._io_bytes(n_rows, 1, 1, 0) if self.kind == "backward" else \
            self._io_bytes(n_rows, 0, 0, 2)
        return self._io_bytes(n_rows, n_dim, 4, 1) + rows + \
            self.workspace_bytes(n_rows, n_dim)


class CosineEmbeddingLossSplitBackward(_Gradients, Kernel):
    """dx1, dx2 for the upstream gradient scale * dy[r * dy_stride] from the partials and a
    second read of each slice: the arguments of CosineEmbeddingLossBackwardRows, the partials
    after y."""

    name = "cosine_embedding_loss_split_backward"
    short_name = "backward-split"
    kind = "backward"
    args = _with_sums(CosineEmbeddingLossBackwardRows.args, after="y")


class CosineEmbeddingLossSplitBackwardKeep(WaveGrid, CosineEmbeddingLossSplitBackward):
    """The split backward for dx1 and dx2 that hold the gradients for an upstream gradient of
    1: a row whose dy is 1 is left as it is (CosineEmbeddingLossBackwardKeep's contract), on a
    grid of at most one wave walking the slices in the same reverse order: cek.torch's backward
    after the split fused forward, with the partials that forward left."""

    name = "cosine_embedding_loss_split_backward_keep"
    short_name = "backward-keep-split"
    args = _with_sums(CosineEmbeddingLossBackwardKeep.args, after="y")
    launch_contract = ("block [1024, 1, 1]; grid [G, 1, 1] with 1 <= G <= n_rows * S (cek's "
                       "launchers: min(that, min_blocks * SMs)), block b taking slices b, b + G, "
                       "... of the reverse walk; after split-sums, whose partials it reads")


class CosineEmbeddingLossSplitFused(_Gradients, Kernel):
    """Per-row loss and dx1, dx2 from the partials and a second read of each slice; row r's
    upstream gradient is scale * dy[r], or scale without dy: the arguments of
    CosineEmbeddingLossFused, the partials after scale."""

    name = "cosine_embedding_loss_split_fused"
    short_name = "fused-split"
    kind = "fused"
    args = _with_sums(CosineEmbeddingLossFused.args, after="scale")
