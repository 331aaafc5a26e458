"""cek/split_model.py, the model behind where the launchers split a few wide rows: its choice at
the shapes docs/design.md names ("Wide rows, few of them"), the instruction issue it counts, and
its issue figures against the SASS they were measured from (compile tier, pinned toolchain).
"""

import pytest

from cek import cosine_embedding_loss_split as split
from cek import dtypes, sass, split_issue, split_model

# The H200's issue rate by hand: 132 SMs x 4 schedulers x 32 threads x 1.98 GHz.
H200_ISSUE_PER_S = 132 * 4 * 32 * 1.98e9


# Where the launchers split, as the model counting each launch's instruction issue gives it
# (`python -m cek.split_model`). 128 x 32768 in float32 and 140 x 32768 in bfloat16 split
# while the model assumed the split's launches at the copy rate (1.11 and 1.21 times faster);
# counting issue, one block a row is within MARGIN (1.07 and 1.07). 140 x 32768 in float32 still
# splits (1.29): its fused-split is at the issue rate and the copy rate alike, and its second
# wave of 8 rows of one block each is what the split saves. A GPU run settles each
# (scripts/device_check.sh times 48, 128 and 256 rows of 32768 and 48 x 2^20 both ways).
@pytest.mark.parametrize("n_rows, n_dim, dtype, splits", [
    (48, 32768, "f32", False), (48, 32768, "bf16", False),
    (128, 32768, "f32", False), (128, 32768, "bf16", False),
    (140, 32768, "f32", True), (140, 32768, "bf16", False),
    (256, 32768, "f32", False), (256, 32768, "bf16", False),
    (8, 1 << 20, "f32", True), (8, 1 << 20, "bf16", True),
    (48, 1 << 20, "f32", False), (48, 1 << 20, "bf16", False),
])
def test_where_the_issue_bound_model_splits(n_rows, n_dim, dtype, splits):
    assert split.splits(n_rows, n_dim, dtype) is splits


@pytest.mark.parametrize("dtype, low, high", [("f32", 4.3, 4.8), ("bf16", 5.4, 6.1)])
def test_a_few_rows_of_2_20_still_split_several_times_faster(dtype, low, high):
    # 8 rows of one block leave 124 SMs idle: the split is DRAM-bound in float32 (71% and 58% of
    # the issue slots at the copy rate) and gives up some of it in bfloat16 (fused-split: 71%,
    # but the L2 part of its reads does not count for DRAM)
    speedup = split_model.speedup(8, 1 << 20, dtypes.get(dtype).array.itemsize)
    assert low <= speedup <= high, speedup


def test_the_issue_share_at_the_copy_rate_is_instructions_over_issue_slots():
    # split-sums at 5.544 instructions a byte: 5.544 x 4.3 TB/s of the 33.45e12 instructions a
    # second 132 SMs issue, 71%; bfloat16's 6.481, 83%
    assert split_model.issue_rate(10_000) == split_model.issue_rate(132) == H200_ISSUE_PER_S
    assert split_model.issue_rate(8) == 8 * H200_ISSUE_PER_S / 132
    assert split_model.issue_share_at_copy_rate(5.544) == pytest.approx(0.7126, abs=1e-4)
    assert split_model.issue_share_at_copy_rate(6.481) == pytest.approx(0.8331, abs=1e-4)


def test_a_launch_is_as_slow_as_its_bytes_or_its_instructions():
    # 140 rows of 32768 bfloat16 (4 slices a row): fused-split reads 18.4 MB of x1 and x2 again,
    # all of it from L2 (under half of it), and writes 18.4 MB of dx: 4.3 us of DRAM at the
    # copy rate, but 5.499 instructions a byte over 36.7 MB is 6.0 us of issue on 132 SMs
    both = 2 * 2 * 140 * 32768
    sums, second = split_model.split_launches(140, 32768, 2)
    issue = split_model.ISSUE[2]
    assert second == pytest.approx(issue.fused_split * 2 * both / H200_ISSUE_PER_S)
    assert second == pytest.approx(6.03e-6, rel=0.01)
    assert second > 1.4 * both / 4.3e12
    assert sums == pytest.approx(both / 4.3e12)  # 83% of issue: the copy rate binds
    # 8 rows of 32768 float32 (8 slices a row): 32 blocks of sums, 64 of fused-split, each on
    # an SM of its own: their issue binds, where the copy rate said 0.5 us and 1.0 us
    both = 2 * 4 * 8 * 32768
    sums, second = split_model.split_launches(8, 32768, 4)
    assert sums == pytest.approx(split_model.ISSUE[4].sums * both / (32 * H200_ISSUE_PER_S / 132))
    assert second == pytest.approx(
        split_model.ISSUE[4].fused_split * 2 * both / (64 * H200_ISSUE_PER_S / 132))


def test_one_block_a_row_counts_its_instructions_too():
    # a row of 32768 bfloat16 on one SM: 1.898 instructions a byte of its first pass (128 KB),
    # 1.391 of its second (read and written, 256 KB) and 286 once a thread: 3.59 us of issue,
    # under the 4.20 us its bytes in flight allow (93.6 GB/s): those bind
    issue = split_model.ISSUE[2]
    row = 2 * 2 * 32768
    instructions = issue.first_pass * row + issue.second_pass * 2 * row + issue.per_row * 1024
    assert instructions / (H200_ISSUE_PER_S / 132) == pytest.approx(3.59e-6, rel=0.01)
    assert split_model.one_block_row_seconds(32768, 2) == pytest.approx(4.20e-6, rel=0.01)


def test_the_models_slices_are_the_kernels():
    # the model counts a launch's blocks from the split's slices, without importing it
    assert split_model.SUMS_SLICES == split.SUMS_SLICES
    assert split_model.THREADS == split.THREADS
    for dtype in dtypes.DTYPES:
        itemsize = dtypes.get(dtype).array.itemsize
        assert split_model.THREADS * split_model.CHUNK_BYTES // itemsize == split.slice_width(dtype)


# The figures ISSUE holds, recomputed from the SASS of the pinned NVRTC (the other NVRTCs of
# .ci/nvrtc-matrix.txt compile other instruction counts; the model keeps these: a row's bits
# may not depend on the NVRTC at hand). 16-bit types share bfloat16's figures.
@pytest.mark.compile
@pytest.mark.exact_sass
@pytest.mark.skipif(sass.find_nvdisasm() is None, reason=sass.MISSING)
@pytest.mark.parametrize("dtype", ["f32", "f64", "f16", "bf16"])
def test_the_issue_figures_are_the_compiled_codes(dtype):
    pinned = split_model.ISSUE[dtypes.get(dtype).array.itemsize]
    measured = split_issue.measured_issue(dtype)
    for name in ("sums", "fused_split", "first_pass", "second_pass", "per_row"):
        want, got = getattr(pinned, name), getattr(measured, name)
        assert abs(got - want) <= split_model.ISSUE_TOLERANCE * want, (name, got, want)
