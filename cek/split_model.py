"""When a few wide rows run split across blocks: the first-order time model behind
cek.cosine_embedding_loss_split.splits, for the fused training step (docs/design.md, "Wide rows,
few of them").

Both ways read x1 and x2 from DRAM once and write dx1 and dx2 once, and read x1 and x2 a second
time; they differ in where that second read comes from and in how much of the GPU works:

- One block a row (the streamed kernel): a block of 1024 threads an SM (56-62 registers), each
  thread with CEK_STREAM_UNROLL chunk pairs in flight (two in 16-bit types), so an SM moves at
  most its bytes in flight over the loaded latency. A wave of k rows streams at
  min(the copy rate, k * that rate). Each block reads its row again right after its first pass,
  backwards from its end: a part u of the row was read within 3*k*R bytes of everyone's traffic
  (the first read, the second, the writes), and comes from L2 where that is under half of it.
- The split: every SM busy, at the copy rate, with one launch more; its second read walks the
  slices back from the last the sums read, so the last half of L2 that the sums read hits.

The constants are those of the H200 (132 SMs, 60 MB of L2 and a device-to-device copy of about
4.3 TB/s, as read on one; 700 ns loaded DRAM latency and 2.5 us to launch and drain a kernel,
estimates). They are fixed, not read off the device: the choice sets the order of a row's
additions, so its bits must depend on N and D alone. A GPU run settles the model
(scripts/device_check.sh times both ways at 48, 128 and 256 rows of 32768 and at 48 x 2^20).
"""

from __future__ import annotations

SMS = 132
COPY_BYTES_PER_S = 4.3e12
L2_BYTES = 60 << 20
LOADED_LATENCY_S = 700e-9
LAUNCH_S = 2.5e-6
# One SM's global-memory pipeline, an estimate: 64 bytes a cycle at the 1980 MHz an H200's SMs
# ran at under load (127 GB/s, against the 33 GB/s an SM's share of the copy rate is).
SM_BYTES_PER_CYCLE = 64
SM_CLOCK_HZ = 1.98e9
# The split costs a launch more, and the model counts one block a row's second read
# pessimistically: the split runs where the model finds it this much faster.
MARGIN = 1.1
THREADS = 1024
CHUNK_BYTES = 16


def one_block_rate(itemsize: int) -> float:
    """Bytes a second one streamed block moves: its loads in flight over the loaded latency
    (CEK_STREAM_UNROLL = 4 chunk pairs a thread, 2 in 16-bit types: cek_row.cuh), at most what
    one SM's memory pipeline takes (SM_BYTES_PER_CYCLE at SM_CLOCK_HZ)."""
    pairs = 2 if itemsize == 2 else 4
    return min(THREADS * pairs * 2 * CHUNK_BYTES / LOADED_LATENCY_S,
               SM_BYTES_PER_CYCLE * SM_CLOCK_HZ)


def one_block_seconds(n_rows: int, n_dim: int, itemsize: int) -> float:
    """The fused kernel of one block a row: its waves of at most SMS rows, each as slow as its
    DRAM traffic at the copy rate or one block's work at one_block_rate, whichever is slower."""
    row = 2 * itemsize * n_dim  # x1 and x2
    seconds, left = LAUNCH_S, n_rows
    while left > 0:
        k = min(left, SMS)
        hit = min(1.0, (L2_BYTES / 2) / (3 * k * row))  # the second read's share from L2
        seconds += max(k * row * (3 - hit) / COPY_BYTES_PER_S,
                       3 * row / one_block_rate(itemsize))
        left -= k
    return seconds


def split_seconds(n_rows: int, n_dim: int, itemsize: int) -> float:
    """The split pair: the partial sums, then the fused kernel a block a slice, at the copy rate
    but for the second read's last half an L2 (the partials' bytes are a thousandth: left out)."""
    both = 2 * itemsize * n_rows * n_dim
    return 2 * LAUNCH_S + (3 * both - min(both, L2_BYTES / 2)) / COPY_BYTES_PER_S


def speedup(n_rows: int, n_dim: int, itemsize: int) -> float:
    """How many times faster the split is than one block a row, by the model."""
    return one_block_seconds(n_rows, n_dim, itemsize) / split_seconds(n_rows, n_dim, itemsize)


def prefers_split(n_rows: int, n_dim: int, itemsize: int) -> bool:
    """Whether the model finds the split at least MARGIN times faster (cek's launchers ask only
    below cek.cosine_embedding_loss_split.SPLIT_BELOW_ROWS: at most two waves to add up)."""
    return speedup(n_rows, n_dim, itemsize) > MARGIN
