"""When a few wide rows run split across blocks: the first-order time model behind
cek.cosine_embedding_loss_split.splits, for the fused training step (docs/design.md, "Wide rows,
few of them").

Both ways read x1 and x2 from DRAM once and write dx1 and dx2 once, and read x1 and x2 a second
time; they differ in where that second read comes from, in how much of the GPU works, and in the
instructions each issues for a byte:

- One block a row (the streamed kernel): a block of 1024 threads an SM (56-62 registers), each
  thread with CEK_STREAM_UNROLL chunk pairs in flight (two in 16-bit types), so an SM moves at
  most its bytes in flight over the loaded latency. A wave of k rows streams at
  min(the copy rate, k * that rate). Each block reads its row again right after its first pass,
  backwards from its end: a part u of the row was read within 3*k*R bytes of everyone's traffic
  (the first read, the second, the writes), and comes from L2 where that is under half of it.
- The split: two launches, each as slow as its DRAM traffic at the copy rate or its
  instructions at the issue rate of the SMs its grid covers, whichever is slower; its second
  read walks the slices back from the last the sums read, so the last half of L2 that the sums
  read hits (fast for DRAM, not for issue: a byte from L2 costs the instructions a byte from
  DRAM does).

Instructions issued per byte (ISSUE) are constants measured from the kernels' SASS
(`cek.split_issue`, `python -m cek.split_issue`); tests/test_split_model.py recomputes
them on the pinned toolchain and fails when one drifts by more than ISSUE_TOLERANCE. The other
constants are those of the H200 (132 SMs, 60 MB of L2 and a device-to-device copy of about
4.3 TB/s, as read on one; 700 ns loaded DRAM latency, 2.5 us to launch and drain a kernel and
the SM's 64 bytes a cycle, estimates). None is read off the device or the NVRTC at hand: the
choice sets the order of a row's additions, so its bits must depend on N, D and the dtype alone.
A GPU run settles the model (scripts/device_check.sh times both ways at 48, 128 and 256 rows of
32768 and at 48 x 2^20).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

SMS = 132
COPY_BYTES_PER_S = 4.3e12
L2_BYTES = 60 << 20
LOADED_LATENCY_S = 700e-9
LAUNCH_S = 2.5e-6
# One SM's global-memory pipeline, an estimate: 64 bytes a cycle at the 1980 MHz an H200's SMs
# ran at under load (127 GB/s, against the 33 GB/s an SM's share of the copy rate is).
SM_BYTES_PER_CYCLE = 64
SM_CLOCK_HZ = 1.98e9
# An sm_90 SM issues 4 warp instructions a cycle, one from each scheduler: 128 threads' worth.
SM_ISSUE_PER_CYCLE = 128
# The split costs a launch more, and the model counts one block a row's second read
# pessimistically: the split runs where the model finds it this much faster.
MARGIN = 1.1
THREADS = 1024
CHUNK_BYTES = 16
SUMS_SLICES = 2  # the slices a block of split-sums reads (cek.cosine_embedding_loss_split)


@dataclass(frozen=True)
class Issue:
    """Instructions a thread issues, per byte it moves, on sm_90 (the ordinary path, cek.sass).

    sums, fused_split: the split's launches, over the bytes their bytes_moved counts (the
    partials' writes are one thread's of a slice, so a thread's own bytes are what it moves).
    first_pass, second_pass: one block a row's streamed loops, over the bytes a trip reads (the
    sums) and reads and writes (the gradients). per_row: what a thread of that block issues
    once a row, outside its loops (the block's sums, the loss; its tail loops, which run only
    for a width that is no multiple of a trip, counted with neither)."""

    sums: float
    fused_split: float
    first_pass: float
    second_pass: float
    per_row: int


# Measured on NVRTC 13.5 (sm_90) at 8 x 2^20 by cek.split_issue. By itemsize, as the rest of the
# model: the 16-bit figures are bfloat16's (float16's are within ISSUE_TOLERANCE of them).
ISSUE = {
    4: Issue(sums=5.544, fused_split=4.546, first_pass=1.031, second_pass=0.883, per_row=269),
    8: Issue(sums=6.384, fused_split=6.544, first_pass=0.844, second_pass=0.809, per_row=399),
    2: Issue(sums=6.481, fused_split=5.499, first_pass=1.898, second_pass=1.391, per_row=286),
}
# A figure 5% off moves a launch's time by at most 5%, half of MARGIN.
ISSUE_TOLERANCE = 0.05
MEASURED_AT = (8, 1 << 20)


def issue_rate(blocks: int) -> float:
    """Thread instructions a second that a grid of `blocks` issues: every SM it covers at
    SM_ISSUE_PER_CYCLE (a grid of fewer blocks than SMs leaves the rest idle)."""
    return min(blocks, SMS) * SM_ISSUE_PER_CYCLE * SM_CLOCK_HZ


def one_block_rate(itemsize: int) -> float:
    """Bytes a second one streamed block moves: its loads in flight over the loaded latency
    (CEK_STREAM_UNROLL = 4 chunk pairs a thread, 2 in 16-bit types: cek_stream.cuh), at most what
    one SM's memory pipeline takes (SM_BYTES_PER_CYCLE at SM_CLOCK_HZ)."""
    pairs = 2 if itemsize == 2 else 4
    return min(THREADS * pairs * 2 * CHUNK_BYTES / LOADED_LATENCY_S,
               SM_BYTES_PER_CYCLE * SM_CLOCK_HZ)


def one_block_row_seconds(n_dim: int, itemsize: int) -> float:
    """One block's time for its row, alone on its SM: its bytes at one_block_rate, or its
    instructions at one SM's issue rate, whichever is slower."""
    row = 2 * itemsize * n_dim  # x1 and x2
    issue = ISSUE[itemsize]
    instructions = (issue.first_pass * row + issue.second_pass * 2 * row
                    + issue.per_row * THREADS)
    return max(3 * row / one_block_rate(itemsize), instructions / issue_rate(1))


def one_block_seconds(n_rows: int, n_dim: int, itemsize: int) -> float:
    """The fused kernel of one block a row: its waves of at most SMS rows, each as slow as its
    DRAM traffic at the copy rate or one block's row (one_block_row_seconds), whichever is
    slower."""
    row = 2 * itemsize * n_dim
    seconds, left = LAUNCH_S, n_rows
    while left > 0:
        k = min(left, SMS)
        hit = min(1.0, (L2_BYTES / 2) / (3 * k * row))  # the second read's share from L2
        seconds += max(k * row * (3 - hit) / COPY_BYTES_PER_S,
                       one_block_row_seconds(n_dim, itemsize))
        left -= k
    return seconds


def split_launches(n_rows: int, n_dim: int, itemsize: int) -> tuple[float, float]:
    """(split-sums, fused-split) seconds, launches left out: each its DRAM bytes at the copy
    rate or its instructions at issue_rate of its grid, whichever is slower. The sums read x1
    and x2 (B bytes); fused-split reads them again and writes dx1 and dx2 (2B), the last half
    an L2 of the sums' reads from L2 (the partials' bytes are a thousandth: left out)."""
    both = 2 * itemsize * n_rows * n_dim
    slices = -(-n_dim // (THREADS * CHUNK_BYTES // itemsize))
    issue = ISSUE[itemsize]
    sums = max(both / COPY_BYTES_PER_S,
               issue.sums * both / issue_rate(-(-n_rows * slices // SUMS_SLICES)))
    second = max((2 * both - min(both, L2_BYTES / 2)) / COPY_BYTES_PER_S,
                 issue.fused_split * 2 * both / issue_rate(n_rows * slices))
    return sums, second


def split_seconds(n_rows: int, n_dim: int, itemsize: int) -> float:
    """The split pair: its two launches (split_launches) and the cost of launching each."""
    return 2 * LAUNCH_S + sum(split_launches(n_rows, n_dim, itemsize))


def speedup(n_rows: int, n_dim: int, itemsize: int) -> float:
    """How many times faster the split is than one block a row, by the model."""
    return one_block_seconds(n_rows, n_dim, itemsize) / split_seconds(n_rows, n_dim, itemsize)


def prefers_split(n_rows: int, n_dim: int, itemsize: int) -> bool:
    """Whether the model finds the split at least MARGIN times faster (cek's launchers ask only
    below cek.cosine_embedding_loss_split.SPLIT_BELOW_ROWS: at most two waves to add up)."""
    return speedup(n_rows, n_dim, itemsize) > MARGIN


def issue_share_at_copy_rate(per_byte: float) -> float:
    """The share of the GPU's issue slots that a kernel issuing `per_byte` instructions a byte
    needs to move its bytes at the copy rate (over 1: it cannot)."""
    return per_byte * COPY_BYTES_PER_S / issue_rate(SMS)


SHAPES = [(n_rows, n_dim) for n_dim in (32768, 1 << 20) for n_rows in (8, 48, 128, 140, 256)]


def main(argv: list[str]) -> None:
    """The model's times and choice at SHAPES in float32 and bfloat16 (the issue figures read
    again from the SASS: `python -m cek.split_issue`)."""
    for dtype, itemsize in (("f32", 4), ("bf16", 2)):
        for n_rows, n_dim in SHAPES:
            sums, second = split_launches(n_rows, n_dim, itemsize)
            print(f"{dtype:4} {n_rows:4} x {n_dim:7}: one block a row "
                  f"{one_block_seconds(n_rows, n_dim, itemsize) * 1e6:6.1f} us, split "
                  f"{split_seconds(n_rows, n_dim, itemsize) * 1e6:6.1f} us (sums {sums * 1e6:.1f}"
                  f", fused-split {second * 1e6:.1f}), speed-up "
                  f"{speedup(n_rows, n_dim, itemsize):.2f}: "
                  f"{'split' if prefers_split(n_rows, n_dim, itemsize) else 'one block a row'}")
    for itemsize, issue in ISSUE.items():
        print(f"itemsize {itemsize}: issue slots at the copy rate: split-sums "
              f"{issue_share_at_copy_rate(issue.sums):.0%}, fused-split "
              f"{issue_share_at_copy_rate(issue.fused_split):.0%}")


if __name__ == "__main__":
    main(sys.argv[1:])
