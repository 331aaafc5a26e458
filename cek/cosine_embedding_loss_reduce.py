"""CosineEmbeddingLossReduce: the Kernel for kernels/cosine_embedding_loss_reduce.cu."""

from cek import dtypes
from cek.cosine_embedding_loss_backward import ROW
from cek.kernel import Arg, Kernel, _is_int

THREADS = 1024


class CosineEmbeddingLossReduce(Kernel):
    """The mean or sum of per-row losses: `reduced` (0-d, x1's dtype) = scale * sum(loss), added
    by one block of 1024 threads in an order fixed by the code (the same bits run after run and
    on every GPU). `loss` [n_rows] is what the fused or forward-rows kernel wrote; scale is
    1/n_rows for the mean, 1 for the sum. The row width does not enter: there is one instance
    per dtype (`for_dtype`), whose block_size is its thread count."""

    name = "cosine_embedding_loss_reduce"
    kind = "reduce"
    max_block_size = THREADS
    launch_contract = "grid [1, 1, 1], block [1024, 1, 1]: one block adds every row's loss"
    args = (
        Arg("loss", "A*", ROW),
        Arg("reduced", "T*", (), output=True),
        Arg("n_rows", "int"),
        Arg("scale", "A"),
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
        return 1  # one block a launch

    def bytes_moved(self, n_rows: int, n_dim: int | None = None) -> int:
        # Header of the .cu: the losses read once (A each), the reduced value written (S).
        d = dtypes.get(self.dtype)
        return d.acc.itemsize * n_rows + d.array.itemsize

    def launch_config(self, n_rows: int, n_dim: int | None = None) -> tuple[tuple, tuple, int]:
        """One block of 1024 threads for any n_rows in [0, 2^31); n_dim, the width of the rows
        whose losses these are, changes nothing."""
        if not _is_int(n_rows) or not 0 <= n_rows < 2**31:
            raise ValueError(f"n_rows must be an int in [0, 2^31), got {n_rows!r}")
        return (1, 1, 1), (THREADS, 1, 1), 0

    def problem_size(self, cast_args) -> tuple[int, None]:
        return int(cast_args[2]), None
