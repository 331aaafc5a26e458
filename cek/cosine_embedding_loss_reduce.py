"""CosineEmbeddingLossReduce: the Kernel for kernels/cosine_embedding_loss_reduce.cu."""

from cek import dtypes
from cek.cosine_embedding_loss_backward import ROW
from cek.kernel import Kernel
from cek.kernel_args import Arg
from cek.tiling import dims3, is_int

THREADS = 1024
CHUNKS = 8  # CEK_REDUCE_CHUNKS: 16-byte chunks a thread has in flight a trip
# The most trips one block makes before the launchers split the reduction in two levels: one
# block then waits on memory for at most 2 trips and the remainder's round (3), the two levels
# for one trip a block, one over the partials and a remainder round each (4).
ONE_BLOCK_TRIPS = 2


class CosineEmbeddingLossReduce(Kernel):
    """The mean or sum of per-row losses: `reduced` (0-d, x1's dtype) = scale * sum(loss), added
    by blocks of 1024 threads in an order fixed by the code (the same bits run after run and
    on every GPU). `loss` [n_rows] is what the fused or forward-rows kernel wrote; scale is
    1/n_rows for the mean, 1 for the sum. The row width does not enter: there is one instance
    per dtype (`for_dtype`), whose block_size is its thread count.

    Without `partials` one block adds every loss. With `partials` ([blocks(n_rows)], the
    accumulation dtype) block b adds the slice of `slice_rows` losses from b * slice_rows and
    writes their unscaled sum to partials[b]; the same kernel without partials then reduces
    those (`level_one_blocks` says when the launchers do so)."""

    name = "cosine_embedding_loss_reduce"
    kind = "reduce"
    max_block_size = THREADS
    launch_contract = ("block [1024, 1, 1]; grid [1, 1, 1] without partials: one block adds "
                       "every row's loss; grid [ceil(n_rows / slice_rows), 1, 1] with them: "
                       "block b adds slice b into partials[b]")
    args = (
        Arg("loss", "A*", ROW),
        Arg("reduced", "T*", (), output=True),
        Arg("n_rows", "int"),
        Arg("scale", "A"),
        # [blocks(n_rows)]: a shape no int argument gives, checked in check_args
        Arg("partials", "A*", (), output=True, optional=True),
    )

    def __init__(self, block_size: int = THREADS, dtype: str = "f32"):
        super().__init__(block_size, dtype)
        if self.block_size != THREADS:
            raise ValueError(f"{self.name} runs {THREADS} threads: block_size must be {THREADS}, "
                             f"got {block_size}")

    @classmethod
    def for_dtype(cls, dtype: str = "f32") -> "CosineEmbeddingLossReduce":
        return cls(THREADS, dtype)

    @classmethod
    def for_n_dim(cls, n_dim: int, dtype: str = "f32") -> "CosineEmbeddingLossReduce":
        """The reduction of rows of any width: the same kernel (`for_dtype`)."""
        return cls.for_dtype(dtype)

    @classmethod
    def block_sizes(cls) -> list[int]:
        return [THREADS]

    @property
    def max_threads(self) -> int:
        return THREADS

    @property
    def min_blocks(self) -> int:
        return 1

    @property
    def slice_rows(self) -> int:
        """Losses one block adds in one trip of its threads: a first-level block's slice
        (cek_reduce_slice: 32768 floats, 16384 doubles)."""
        return CHUNKS * THREADS * (16 // dtypes.get(self.dtype).acc.itemsize)

    def blocks(self, n_rows: int) -> int:
        """Blocks of a launch with partials, and the partials it writes: ceil(n_rows / slice)."""
        return -(-n_rows // self.slice_rows)

    def level_one_blocks(self, n_rows: int) -> int:
        """0 where one launch reduces n_rows losses (ONE_BLOCK_TRIPS trips of one block: 65536
        floats, 32768 doubles), else the blocks of the first of two launches."""
        return 0 if n_rows <= ONE_BLOCK_TRIPS * self.slice_rows else self.blocks(n_rows)

    def bytes_moved(self, n_rows: int, n_dim: int | None = None) -> int:
        # Header of the .cu: the losses read once (A each), the partials of a first level
        # written and read once (A each), the reduced value written (S).
        d = dtypes.get(self.dtype)
        return d.acc.itemsize * (n_rows + 2 * self.level_one_blocks(n_rows)) + d.array.itemsize

    def launch_config(self, n_rows: int, n_dim: int | None = None,
                      partials: bool = False) -> tuple[tuple, tuple, int]:
        """1024 threads; one block for any n_rows in [0, 2^31) without partials, one a slice
        with them (n_rows >= 1). n_dim, the width of the rows whose losses these are, changes
        nothing."""
        if not is_int(n_rows) or not 0 <= n_rows < 2**31:
            raise ValueError(f"n_rows must be an int in [0, 2^31), got {n_rows!r}")
        if not partials:
            return (1, 1, 1), (THREADS, 1, 1), 0
        if n_rows == 0:
            raise ValueError("a launch with partials needs n_rows >= 1, got 0")
        return (self.blocks(int(n_rows)), 1, 1), (THREADS, 1, 1), 0

    def check_launch(self, grid, block, n_rows: int, n_dim: int | None = None,
                     partials: bool = False) -> None:
        want_grid, want_block, _ = self.launch_config(n_rows, n_dim, partials)
        if (dims3(grid), dims3(block)) != (want_grid, want_block):
            given = "with" if partials else "without"
            raise ValueError(
                f"{self.id}: grid {grid!r}, block {block!r} differ from launch_config({n_rows}, "
                f"partials={partials}) = grid {want_grid}, block {want_block} ({given} partials)")

    def check_args(self, args, array_types) -> tuple:
        """Kernel.check_args, and partials (when given) an [blocks(n_rows)] array of the
        accumulation dtype."""
        if len(args) != len(self.args) or args[4] is None:
            return super().check_args(args, array_types)
        cast = super().check_args((*args[:4], None), array_types)
        partials, want = args[4], self.arg_dtype(self.args[4])
        if not isinstance(partials, array_types):
            names = " or ".join(f"{t.__module__}.{t.__name__}" for t in array_types)
            raise TypeError(f"partials must be a {names} or None, got {type(partials).__name__}")
        if partials.dtype != want:
            raise TypeError(f"partials must be {want}, got {partials.dtype}")
        n_rows = int(cast[2])
        if tuple(partials.shape) != (self.blocks(n_rows),):
            raise ValueError(f"partials must have shape (ceil(n_rows / {self.slice_rows}),) = "
                             f"({self.blocks(n_rows)},), got {partials.shape}")
        if not partials.flags.c_contiguous:
            raise ValueError("partials must be C-contiguous")
        return (*cast[:4], partials)

    def problem_size(self, cast_args) -> tuple[int, None, bool]:
        """(n_rows, None, whether partials are given): what launch_config takes."""
        return int(cast_args[2]), None, cast_args[4] is not None
