"""How a launch is shaped, mirrored from kernels/cek_tiling.cuh (CekTiling): its constants, the
SM limits ptxas takes __launch_bounds__ against, the widest row held in registers, and the two
mixins that change a Kernel's launch: row groups for narrow rows, and a grid of one wave for the
keep kernels. The Kernel base class and its launch contract in words are cek.kernel's."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from cek import dtypes

# Mirrors of the constants in kernels/cek_tiling.cuh.
WARP = 32
MAX_THREADS = 1024
TWO_PAIRS_FROM_CHUNKS = 256  # CEK_TWO_PAIRS_FROM_CHUNKS: 513 floats, 1025 16-bit values and up
MAX_GROUPED_CHUNKS = 64  # row groups: the fused kernel and the *_rows variants
MAX_GROUPED_SIZE = 256  # ... and rows of at most 256 elements (CEK_MAX_GROUPED_SIZE)
GROUPED_16_BIT_SIZE = 1024  # ... and 16-bit rows of 513..1024 (CEK_GROUPED_16_BIT_SIZE)
GROUPED_THREADS = 256
TAIL_THREADS = 672  # blocks of 672 fit three an SM, where 704 or 736 fit two
SM_THREADS = 2048  # resident threads an sm_80 or sm_90 SM holds
MAX_BLOCKS_PER_SM = 32


# Resident threads and blocks an SM holds, by the lowest __CUDA_ARCH__ they hold from (highest
# first): what ptxas takes __launch_bounds__' blocks an SM against. A value of more blocks, or
# of more threads, is "out of range" and ignored with a warning (NVRTC 13.5: sm_75 and sm_107
# 1024 and 16; sm_86 to sm_88 1536 and 16; sm_89, sm_110, sm_120 and sm_121 1536 and 24; the
# rest 2048 and 32). sm_101, NVRTC 12.9's name for what 13.0 calls sm_110, is taken to be sm_110.
SM_LIMITS = ((1100, 1536, 24), (1070, 1024, 16), (1030, 2048, 32), (1010, 1536, 24),
             (1000, 2048, 32), (900, 2048, 32), (890, 1536, 24), (860, 1536, 16), (800, 2048, 32),
             (750, 1024, 16), (700, 2048, 32))


def sm_limits(arch: int) -> tuple[int, int]:
    """(threads, blocks) resident on an SM of `arch` (__CUDA_ARCH__: 800 for sm_80)."""
    for lowest, threads, blocks in SM_LIMITS:
        if arch >= lowest:
            return threads, blocks
    raise ValueError(f"arch must be 700 (sm_70) or later, got {arch}")


def register_path_width(dtype: str) -> int:
    """The widest row one block holds in registers (CekTiling::STREAMED above it): 4096 chunks,
    2048 for 2-byte types, whose conversions need registers too; 16384 elements, 8192 doubles."""
    d = dtypes.get(dtype)
    return (4096 if d.array.itemsize >= 4 else 2048) * d.vec


def next_power_of_two(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def dims3(value) -> tuple | None:
    """A grid or block given as an int or a sequence of up to 3, as (x, y, z); None if neither."""
    dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(dims) <= 3 or not all(is_int(d) for d in dims):
        return None
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


class RowGroups:
    """Mixin for kernels that run narrow rows in row groups (CekTiling::GROUPED in cek_tiling.cuh):
    up to 64 chunks and 256 elements per row, and 16-bit rows of 513..1024 (four chunk pairs a
    lane), GROUP lanes of a warp own a row (min(32, chunks), half the chunks for float and
    16-bit rows of 2..32 chunks: two pairs a lane) and a 256-thread block holds
    256 / GROUP rows. Wider rows keep one block per row."""

    launch_contract: ClassVar[str]  # cek.kernel's _row_groups_contract

    @property
    def grouped(self) -> bool:
        return (self.row_chunks <= MAX_GROUPED_CHUNKS and self.block_size <= MAX_GROUPED_SIZE) or (
            dtypes.get(self.dtype).array.itemsize == 2 and self.block_size == GROUPED_16_BIT_SIZE)

    @property
    def max_threads(self) -> int:
        """The block size the entry point promises in __launch_bounds__: row groups always run
        256 threads, which lets ptxas use more registers (at 1024 it spilled on sm_80)."""
        return GROUPED_THREADS if self.grouped else super().max_threads

    @property
    def chunks_held(self) -> int:
        return self.row_chunks // self.group if self.grouped else super().chunks_held

    @property
    def runs_twin_code(self) -> bool:
        """True for a variant whose rows are too wide for row groups: it runs its twin's device
        code (backward-rows with the upstream gradient's stride and scale as arguments, where
        the backward kernel has them as constants; tests/test_nvrtc.py compiles every class at
        each code path's width)."""
        return self.twin is not None and not self.grouped

    @property
    def group(self) -> int:
        """Lanes per row on the row-group path: min(32, chunks), but half the chunks (two chunk
        pairs a lane) for float and 16-bit rows of 2..32 chunks (CekTiling::GROUP)."""
        if 2 <= self.row_chunks <= WARP and dtypes.get(self.dtype).array.itemsize in (2, 4):
            return self.row_chunks // 2
        return min(WARP, self.row_chunks)

    def _grid_and_block(self, n_rows: int, n_dim: int) -> tuple[tuple, tuple]:
        if not self.grouped:
            return super()._grid_and_block(n_rows, n_dim)
        rows_per_block = GROUPED_THREADS // self.group
        return (math.ceil(n_rows / rows_per_block), 1, 1), (GROUPED_THREADS, 1, 1)


class WaveGrid:
    """Mixin of the keep kernels: the block of the kernel it extends, and a grid of at most one
    wave. Where one block a row (a row group, a slice) would have `most` blocks, G blocks with
    1 <= G <= most each take an even share of them, so that a launch whose work is mostly
    nothing (an upstream gradient of 1: every row kept) costs a wave of blocks, not N. The
    results do not depend on G: each row is computed by one block (or group) as it would be
    alone. The launchers take G = min(most, blocks_per_sm * SMs), the blocks of this kernel
    that one SM of the device holds at once (cek.gpu.resident_blocks: the device's limits and
    the compiled function's registers), so that one wave runs them all on any arch."""

    wave_grid = True

    def launch_config(self, n_rows: int, n_dim: int, sms: int | None = None,
                      blocks_per_sm: int | None = None):
        """(grid, block, shared_mem); without `sms` (the device's multiprocessors) the grid is
        the widest one, a block for each row (row group, slice). `blocks_per_sm` defaults to
        min_blocks, what __launch_bounds__ keeps resident on an SM of 2048 threads and 64K
        registers (sm_80, sm_90; an sm_75 SM holds half the threads)."""
        (most, _, _), block, shared_mem = super().launch_config(n_rows, n_dim)
        if sms is not None:
            per_sm = self.min_blocks if blocks_per_sm is None else blocks_per_sm
            for name, value in (("sms", sms), ("blocks_per_sm", per_sm)):
                if not is_int(value) or value < 1:
                    raise ValueError(f"{name} must be a positive int, got {value!r}")
            most = min(most, int(per_sm) * int(sms))
        return (most, 1, 1), block, shared_mem

    def check_launch(self, grid, block, n_rows: int, n_dim: int) -> None:
        """ValueError unless block is launch_config's and grid is [G, 1, 1], 1 <= G <= the
        widest grid: fewer blocks only take more rows each."""
        (most, _, _), want_block, _ = self.launch_config(n_rows, n_dim)
        got_grid, got_block = dims3(grid), dims3(block)
        if got_block != want_block or got_grid is None or got_grid[1:] != (1, 1) or \
                not 1 <= got_grid[0] <= most:
            raise ValueError(
                f"{self.id}: grid {grid!r}, block {block!r}: launch_config({n_rows}, {n_dim}) "
                f"takes block {want_block} and grid [G, 1, 1] with 1 <= G <= {most}")
