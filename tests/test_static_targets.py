"""The kernels' speed targets, read from the compiled code through the static report (sm_90, H200).

Each test is a speed claim of docs/design.md turned into a fact of the SASS or of NVIDIA's
occupancy rules, on the path an ordinary aligned row takes through the cubin that launches
(cek.sass.ordinary_path: the code CEK_RARE_PATH() marks in the source left out), or over every
block of it. A target the kernels do not reach yet is a strict xfail
(pytest.mark.xfail(strict=True)), failing the day it is reached.
"""

import math

import pytest

from cek import report, sass
from cek.compile import compile_kernel, nvrtc_version
from cek.kernel import kernel_classes

pytestmark = [pytest.mark.compile,
              pytest.mark.skipif(sass.find_nvdisasm() is None, reason=sass.MISSING)]

ONE_BLOCK_PER_ROW = ("forward", "backward", "fused")
DTYPES = ("f32", "f64", "f16", "bf16")


def facts(name, dtype, n_dim, n_rows=65536):
    return report.static_row(kernel_classes()[name].for_n_dim(n_dim, dtype), n_rows, n_dim)


def ordinary_opcodes(kernel):
    """The opcodes of the kernel's ordinary path on sm_90, in listing order."""
    listing = sass.disassemble(compile_kernel(kernel, "sm_90").cubin)
    marks = sass.Marks.from_source(kernel.source, f"{kernel.id}.cu")
    return [i.opcode for block in sass.ordinary_path(sass.parse(listing), marks) for i in block]


# 1. One dependent global-load round per row: every chunk of x1 and x2, y and dy, in flight
# before the first use of any of them.
ROUND_CASES = [(n, d, w) for n in ONE_BLOCK_PER_ROW for d in DTYPES for w in (768, 4096)] + [
    ("fused", "f32", 8192), ("backward", "bf16", 8192), ("forward-rows", "f32", 128),
    ("forward-rows", "bf16", 256), ("fused", "f32", 128), ("fused", "f32", 256),
    ("backward-rows", "f32", 128), ("fused", "bf16", 384),
    # double: each chunk's loaded registers were once copied before the next chunk's load
    ("forward", "f64", 8192), ("backward", "f64", 8192), ("fused", "f64", 8192),
    ("forward-rows", "f64", 128), ("backward-rows", "f64", 128),
]


# NVRTC 12.0's ptxas (CuPy for CUDA 12.0), at two chunk pairs a fused float thread (rows of 513
# floats and more), waits on y[row] and dy[row] before it issues the row's loads: 2 rounds, 8
# bytes a thread in flight in the first. 12.9, 13.0 and 13.5 give 1 round
# (.ci/nvrtc-matrix.txt). Strict: the day it holds, this fails.
PTXAS_12_0_TWO_ROUNDS = pytest.mark.xfail(
    nvrtc_version() == (12, 0), strict=True,
    reason="NVRTC 12.0 waits on a fused float thread's labels before its two chunk pairs")


def _on_every_nvrtc(cases, late_on_12_0):
    return [pytest.param(*case, marks=PTXAS_12_0_TWO_ROUNDS) if case in late_on_12_0 else case
            for case in cases]


@pytest.mark.parametrize("name, dtype, n_dim", _on_every_nvrtc(
    ROUND_CASES, {("fused", "f32", 768), ("fused", "f32", 4096), ("fused", "f32", 8192)}))
def test_one_load_round_per_row(name, dtype, n_dim):
    assert facts(name, dtype, n_dim)["sass"]["load_rounds"] == 1


# 2. Half precision as cheap as float: a 16-bit thread holds twice the elements of a float thread
# in the same 16-byte chunks, at most 1.5x the instructions and 2x the integer-ALU ones.
# At D = 384 16-bit rows run one block per row, as float's do (row groups stop at 256 elements):
# 315 and 302 instructions, bf16 and f16, against float's 242 on sm_90. From 513 floats a float
# thread holds two chunk pairs, so a 16-bit row of 768 is set beside a float row of 384, whose
# threads hold one pair as the 16-bit ones do.
@pytest.mark.parametrize("name, n_dim, float_dim", [
    ("backward", 768, 384), ("forward", 768, 384), ("fused", 384, 384),
])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.exact_sass  # some kernels sit 1-4 instructions inside these ratios
def test_half_precision_costs_about_what_float_does(name, n_dim, float_dim, dtype):
    half, single = facts(name, dtype, n_dim)["sass"], facts(name, "f32", float_dim)["sass"]
    held = kernel_classes()[name].for_n_dim
    assert held(n_dim, dtype).chunks_held == held(float_dim, "f32").chunks_held
    assert half["instructions"] <= 1.5 * single["instructions"], (half, single)
    assert half["int_alu"] <= 2 * single["int_alu"], (half, single)


# The fused kernel's 16-bit row of 768 runs a warp a row (four pairs a lane): per element of a row
# it issues no more than the float kernel's 96 threads of two pairs do (27 against 38 on sm_90),
# and at most half the issue slots at the copy rate (43% and 45%, bfloat16 and float16; 62% and
# 58% at one pair a thread, 96 threads a block).
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_16_bit_row_of_768_issues_no_more_than_a_float_row(dtype):
    half, single = facts("fused", dtype, 768), facts("fused", "f32", 768)

    def per_element(row):
        return row["sass"]["instructions"] * row["block"][0] / row["rows_per_block"] / 768

    assert per_element(half) <= per_element(single), (per_element(half), per_element(single))
    assert half["issue_share_at_copy_rate"] <= 0.5, half["issue_share_at_copy_rate"]


# 3. Occupancy: at least 75% theoretical occupancy for float32 and bfloat16 register-path kernels.
# At 8192 a float thread holds two chunk pairs and a 16-bit one a pair at 1024 threads: two
# blocks need 32 registers, which ptxas fits since the huge-row path reads the row again
# (cek_block_row) instead of keeping the registers live through it (47 before: 50%).
# The fused kernel's 16-bit rows of 513..1024 run row groups at 50%, four pairs a lane
# (test_16_bit_rows_trade_occupancy_for_bytes_in_flight, below).
OCCUPANCY_CASES = [(n, d, w) for n in ONE_BLOCK_PER_ROW for d in ("f32", "bf16")
                   for w in (768, 1024, 2048, 4096, 8192)
                   if not (n, d, w) in {("fused", "bf16", 768), ("fused", "bf16", 1024)}] + [
    (n, d, 128) for n in ("forward-rows", "backward-rows", "fused") for d in ("f32", "bf16")] + [
    (n, "f32", 256) for n in ("fused", "forward-rows", "backward-rows", "backward-keep")] + [
    (n, "bf16", 384) for n in ("fused", "forward-rows", "backward-rows", "backward-keep")]


@pytest.mark.parametrize("name, dtype, n_dim", OCCUPANCY_CASES)
def test_register_path_reaches_three_quarters_occupancy(name, dtype, n_dim):
    row = facts(name, dtype, n_dim)
    assert row["occupancy"] >= 0.75, (row["registers"], row["block"], row["occupancy_limit"])
    assert row["spill_stores"] == row["spill_loads"] == row["local_bytes"] == 0


# 4. Bytes in flight: at least twice what Little's law needs per SM to keep an H200's DRAM busy,
# at full occupancy (the read-only forward and its row groups included).
IN_FLIGHT_CASES = [(n, d, w) for n in ONE_BLOCK_PER_ROW for d in ("f32", "bf16")
                   for w in (384, 768, 4096)] + [
    ("forward-rows", d, w) for d in ("f32", "bf16") for w in (64, 128, 256)] + [
    ("fused", "f32", w) for w in (128, 256)] + [("backward-rows", "f32", 128)]


@pytest.mark.parametrize("name, dtype, n_dim", _on_every_nvrtc(
    IN_FLIGHT_CASES, {("fused", "f32", 768), ("fused", "f32", 4096)}))
def test_bytes_in_flight_cover_littles_law_twice(name, dtype, n_dim):
    row = facts(name, dtype, n_dim)
    assert row["bytes_in_flight_per_sm"] >= 2 * row["needed_bytes_in_flight_per_sm"], row


# 6. Wide rows: the streamed loop keeps four chunk pairs of loads in flight per thread.
@pytest.mark.parametrize("name", ONE_BLOCK_PER_ROW)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_streamed_path_keeps_four_chunk_pairs_in_flight(name, dtype):
    ops = ordinary_opcodes(kernel_classes()[name].for_n_dim(1 << 20, dtype))
    first_math = next(i for i, op in enumerate(ops) if op.startswith(("FFMA", "FMUL")))
    assert sum(op.startswith("LDG") and ".128" in op for op in ops[:first_math]) >= 2 * 4


# ... and its gradient pass, which reads the row again after the block reduction (the last
# barrier before the first gradient store; the fused kernel's reduced loss has barriers after
# the gradients): four chunk pairs in float, eight 128-bit loads before the first gradient store;
# two in bfloat16 (four spill its conversions on sm_80).
@pytest.mark.parametrize("name", ["backward", "fused"])
@pytest.mark.parametrize("dtype, pairs", [("f32", 4), ("bf16", 2)])
def test_streamed_gradient_pass_keeps_chunk_pairs_in_flight(name, dtype, pairs):
    ops = ordinary_opcodes(kernel_classes()[name].for_n_dim(1 << 20, dtype))
    store = next(i for i, op in enumerate(ops) if op.startswith("STG") and ".128" in op)
    after = ops[max(i for i, op in enumerate(ops[:store]) if op.startswith("BAR")):store]
    assert sum(op.startswith("LDG") and ".128" in op for op in after) >= 2 * pairs


# ... and at the widths between the powers of two: every 48th width, and D = 5377..5888, whose
# rows would take blocks of 704 or 736 threads (two an SM, 69-72%) and run 672 (three), a thread
# holding one element past its chunks (CekTiling::TAILED).
WIDTHS_BETWEEN = sorted(set(range(257, 8193, 48)) | {5377, 5400, 5632, 5888})



def _16_bit_rows_of_more_pairs(name, dtype, n_dim):
    """Two chunk pairs a thread at 40 registers (gradient kernels, 1025..8192), or four a lane in
    row groups at 64 (the fused kernel, 513..1024)."""
    return dtype != "f32" and ((name != "forward" and n_dim > 1024) or
                               (name == "fused" and 512 < n_dim <= 1024))


@pytest.mark.parametrize("name", ONE_BLOCK_PER_ROW)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_three_quarters_occupancy_between_the_powers_of_two(name, dtype):
    low = [(d, row["occupancy"]) for d in WIDTHS_BETWEEN
           if not _16_bit_rows_of_more_pairs(name, dtype, d)
           for row in [facts(name, dtype, d)] if row["occupancy"] < 0.75]
    assert not low, low


# ... but 16-bit gradient rows of 1025 and more: two chunk pairs a thread at 40 registers, which
# allow 48 warps an SM, so blocks of 5, 7, 9..11 or 13..15 warps fit 61-70%; and the fused
# kernel's 16-bit rows of 513..1024, a warp a row of four pairs a lane at 64 registers (50%).
# Their target is what occupancy stood for: more bytes in flight than a pair a thread held at
# any occupancy (2048 threads x 32 bytes), 3.5 times what Little's law needs, and at most 3/4 of
# the issue slots at the copy rate, where one pair a thread at 32 registers (75-100%) took up to
# 83% (up to 92% in the fused kernel at 513..1024).
@pytest.mark.parametrize("name", ["fused", "backward"])
def test_16_bit_rows_trade_occupancy_for_bytes_in_flight(name):
    for d in WIDTHS_BETWEEN:
        if not _16_bit_rows_of_more_pairs(name, "bf16", d):
            continue
        row = facts(name, "bf16", d)
        least, most = (0.5, 64) if d <= 1024 else (0.6, 40)
        assert row["occupancy"] >= least and row["registers"] <= most, (d, row["occupancy"])
        assert row["bytes_in_flight_per_sm"] > 2048 * 32, (d, row["bytes_in_flight_per_sm"])
        assert row["bytes_in_flight_per_sm"] >= 3.5 * row["needed_bytes_in_flight_per_sm"], d
        assert row["issue_share_at_copy_rate"] <= 0.75, (d, row["issue_share_at_copy_rate"])


# 7. A mean or sum costs the rows little. The kernels that write the rows' losses (fused with the
# gradients, forward-rows without) and the launches that add them publish at most once per 16
# rows (a fence or an atomic that makes one block's share visible to another), and what runs once
# after the rows, the tail, waits on memory at most 4 times in a row. Today nothing publishes:
# cosine_embedding_loss_reduce adds the per-row losses in launches of their own
# (report.reduction_rows), each block with 128 bytes a thread in flight a trip: 65536 float
# losses in one block, two trips and the round of the n_rows % 4 remainder (counted whether or
# not it runs: 3); a million in 32 blocks of one trip, then one block over their 32 partials
# (2 + 2).
MEAN_CASES = [(name, dtype, n_rows, n_dim) for n_rows, n_dim in ((65536, 768), (1 << 20, 128))
              for name in ("fused", "forward-rows") for dtype in ("f32", "bf16")]


def mean_launches(name, dtype, n_rows, n_dim):
    """The static rows of the launches a mean runs: the rows' kernel, then the reduction's."""
    return [facts(name, dtype, n_dim, n_rows), *report.reduction_rows(dtype, n_rows, n_dim)]


@pytest.mark.parametrize("name, dtype, n_rows, n_dim", MEAN_CASES)
def test_a_mean_publishes_at_most_once_per_16_rows(name, dtype, n_rows, n_dim):
    per_row = 0.0
    for row in mean_launches(name, dtype, n_rows, n_dim):
        sync = row["sass"]["fences"] + row["sass"]["atomics"]
        per_row += sync / row["rows_per_block"]
        if row["reduction"] is not None:
            assert row["reduction"]["publishes_per_row"] == sync / row["rows_per_block"]
    assert per_row <= 1 / 16


@pytest.mark.parametrize("name, dtype, n_rows, n_dim", MEAN_CASES)
def test_a_mean_ends_in_at_most_4_dependent_round_trips(name, dtype, n_rows, n_dim):
    rows, *reduction = mean_launches(name, dtype, n_rows, n_dim)
    assert rows["reduction"] is None  # the rows' kernel has no tail of its own
    tails = [row["reduction"]["tail_round_trips"] for row in reduction]
    assert None not in tails and sum(tails) <= 4, [row["reduction"] for row in reduction]


def test_the_tail_counts_trips_of_the_main_loop():
    # 65536 float losses (256 KB) read by one block of 1024 threads with 128 bytes each in flight
    # a trip: 2 trips of one round each, and the one round outside the loop
    (row,) = report.reduction_rows("f32", 65536, 768)
    trips = math.ceil(65536 * 4 / (1024 * row["sass"]["loop_bytes_in_flight"]))
    assert (row["sass"]["loop_bytes_in_flight"], row["sass"]["loop_rounds"], trips) == (128, 1, 2)
    assert row["reduction"]["tail_round_trips"] == trips + row["sass"]["straight_rounds"] == 3
    # a million: 32 blocks of 32768 losses, one trip each; then 32 partials in one
    first, last = report.reduction_rows("f32", 1 << 20, 128)
    assert (first["grid"][0], first["rows_per_block"], last["rows_per_block"]) == (32, 32768, 32)
    assert (first["reduction"]["tail_round_trips"], last["reduction"]["tail_round_trips"]) == (2, 2)


# 8. Few wide rows use the whole GPU: where the launchers split (8 rows of 2^20, 140 of 32768: a
# nearly empty second wave of one block a row), every kernel of the split that reads the rows
# fills at least one wave (each SM holding as many blocks as its occupancy allows), each
# block's loads in one round. The forward's second launch reads 16 bytes a slice and 4 a row:
# a block a row, fewer than a wave, and its bytes are a thousandth of the partial sums' (what
# fills it would be blocks with nothing to read). The one-block-per-row kernels at these shapes
# run one block an SM: 0.06 and 1.06 waves.
SPLIT_SHAPES = [(8, 1 << 20), (140, 32768)]
# bfloat16's nearly empty second wave that splits is one of 65536: at 140 x 32768 its fused-split
# needs more of the issue slots than its bytes take at the copy rate, and the model, counting
# that (cek/split_model.py), keeps one block a row there (tests/test_split_model.py).
SPLIT_SHAPES_BY_DTYPE = {"f32": SPLIT_SHAPES, "bf16": [(8, 1 << 20), (140, 65536)]}
SPLIT_READERS = ("split-sums", "backward-split", "fused-split", "backward-keep-split")


# NVRTC 12.0's ptxas moves the float gradient kernels' dy, loaded before the slice, into a
# uniform register on sm_90, a move that waits for the load, before it issues the slice's loads:
# 2 rounds. 12.9, 13.0 and 13.5 give 1. Loading dy after the slice gives 1 on 12.0 and 2 for
# the 16-bit fused kernel on every NVRTC: kept as it is. Strict: the day it holds, this fails.
# Every NVRTC of .ci/nvrtc-matrix.txt, 12.0 included: with dy read in the inputs' type and
# widened after the sums, 12.0 issues the float gradient kernels' slice loads with the partials'
# (it issued them after dy arrived, two rounds, when dy was read as float and scaled at once).
def _split_cases():
    for name in SPLIT_READERS:
        for dtype in ("f32", "bf16"):
            for n_rows, n_dim in SPLIT_SHAPES_BY_DTYPE[dtype]:
                yield name, dtype, n_rows, n_dim


@pytest.mark.parametrize("name, dtype, n_rows, n_dim", list(_split_cases()))
def test_the_split_fills_a_wave_with_one_load_round_a_slice(name, dtype, n_rows, n_dim):
    from cek import cosine_embedding_loss_split as split

    assert split.splits(n_rows, n_dim, dtype)
    row = facts(name, dtype, n_dim, n_rows)
    assert row["waves"] >= 1, (row["grid"], row["blocks_per_sm"], row["waves"])
    assert row["spill_stores"] == row["spill_loads"] == row["local_bytes"] == 0
    if name == "backward-keep-split":  # a wave grid: one wave, whatever N (an upstream
        assert row["waves"] == 1.0  # gradient of 1 costs each block one load); dy first, to
        assert row["sass"]["load_rounds"] == 2  # know whether to read the slice: its own round
        # one block of 1024 an SM in 16-bit types, whose loop spilled at the 32 registers two
        # allow (cek/cosine_embedding_loss_split.py, min_blocks)
        assert row["occupancy"] == (0.5 if dtype == "bf16" else 1.0)
        return
    assert row["occupancy"] == 1.0
    assert row["sass"]["load_rounds"] == 1
    assert row["bytes_in_flight_per_sm"] >= 2 * row["needed_bytes_in_flight_per_sm"]


@pytest.mark.parametrize("n_rows, n_dim", SPLIT_SHAPES)
def test_the_splits_forward_launch_is_a_launch_and_no_more(n_rows, n_dim):
    row = facts("forward-split", "f32", n_dim, n_rows)
    sums = kernel_classes()["split-sums"].for_n_dim(n_dim)
    forward = kernel_classes()["forward-split"].for_n_dim(n_dim)
    assert row["sass"]["load_rounds"] == 1 and row["grid"][0] == n_rows
    assert forward.bytes_moved(n_rows, n_dim) <= sums.bytes_moved(n_rows, n_dim) / 1000
    unsplit = facts("fused", "f32", n_dim, n_rows)  # one block of 1024 a row, one an SM
    assert unsplit["blocks_per_sm"] == 1
    assert unsplit["waves"] == pytest.approx(n_rows / report.GPUS["h200"].sms)


# 9. The split-sums launch keeps its bytes in flight: two slices a block, 64 bytes a thread, 128 KB
# an SM at two blocks, over four times what Little's law asks of an H200 at its loaded latency
# and copy bandwidth (one slice a block kept 64 KB, under three times).
@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("n_rows, n_dim", SPLIT_SHAPES)
def test_the_partial_sums_keep_two_slices_in_flight(dtype, n_rows, n_dim):
    row = facts("split-sums", dtype, n_dim, n_rows)
    assert row["sass"]["load_rounds"] == 1
    assert row["sass"]["loads"]["128"] == 4  # x1 and x2 of two slices
    assert row["bytes_in_flight_per_sm"] == 2 * 1024 * 4 * 16  # two blocks of 1024 an SM
    assert row["bytes_in_flight_per_sm"] >= 4 * row["needed_bytes_in_flight_per_sm"]


# 10. The threshold's model (cek/split_model.py, docs/design.md "Wide rows, few of them"): the
# per-SM rate it gives one block a row is the streamed kernel's loads in flight
# (CEK_STREAM_UNROLL chunk pairs a thread, half in 16-bit types) over the loaded latency, at most
# an SM's 64 bytes a cycle; its GPU is the report's H200; and where it puts the shapes the docs
# and the GPU script name.
def test_the_split_models_figures_are_the_kernels_and_the_gpus():
    import re
    from pathlib import Path

    from cek import split_model

    source = (Path(__file__).parents[1] / "kernels" / "cek_stream.cuh").read_text()
    unroll = int(re.search(r"constexpr int CEK_STREAM_UNROLL = (\d+);", source)[1])
    assert "sizeof(T) == 2 ? CEK_STREAM_UNROLL / 2 : CEK_STREAM_UNROLL" in source
    h200 = report.GPUS["h200"]
    assert (split_model.SMS, split_model.L2_BYTES) == (h200.sms, h200.l2_bytes)
    assert split_model.COPY_BYTES_PER_S == h200.copy_bytes_per_s
    assert split_model.LOADED_LATENCY_S == h200.loaded_latency_s
    assert split_model.SM_CLOCK_HZ == h200.sm_clock_hz
    assert split_model.SM_ISSUE_PER_CYCLE == report.SM_ISSUE_PER_CYCLE
    assert split_model.issue_rate(split_model.SMS) == h200.issue_per_s
    for itemsize, pairs in ((4, unroll), (8, unroll), (2, unroll // 2)):
        in_flight = 1024 * pairs * 32 / h200.loaded_latency_s
        assert split_model.one_block_rate(itemsize) == min(in_flight, 64 * 1.98e9)


@pytest.mark.parametrize("n_rows, n_dim, dtype, splits, low, high", [
    (8, 1 << 20, "f32", True, 2.0, None),  # a few rows: one block each cannot keep DRAM busy
    (8, 1 << 20, "bf16", True, 2.0, None),
    (48, 1 << 20, "f32", False, 0.9, 1.1),  # DRAM-bound both ways: within 10%, one launch less
    (256, 32768, "f32", False, 0.9, 1.1),
    (48, 32768, "f32", False, None, 0.9),  # one block a row's second read from L2
    (140, 32768, "f32", True, 1.1, None),  # a second wave of 8 blocks
    # Split while the model put the split's launches at the copy rate (1.11 and 1.21); counting
    # their instruction issue (71% of the slots in bfloat16's fused-split, whose second read
    # from L2 is fast for DRAM, not for issue), one block a row is within MARGIN.
    (128, 32768, "f32", False, 0.9, 1.1), (140, 32768, "bf16", False, 0.9, 1.1),
    (140, 65536, "bf16", True, 1.1, None),  # a second wave of 8 blocks of twice the bytes
])
def test_the_threshold_follows_the_model(n_rows, n_dim, dtype, splits, low, high):
    from cek import cosine_embedding_loss_split as split
    from cek import dtypes, split_model

    speedup = split_model.speedup(n_rows, n_dim, dtypes.get(dtype).array.itemsize)
    assert (low is None or speedup >= low) and (high is None or speedup <= high), speedup
    assert split.splits(n_rows, n_dim, dtype) is splits


# 11. The step's backward where the upstream gradient is 1 costs a wave of blocks at most, whatever
# N (the keep kernel's wave grid), and the mean's reduction waits on memory twice with one
# block's bytes in flight (its misaligned fallback left out as rare).
@pytest.mark.parametrize("n_rows, n_dim", [(65536, 768), (1 << 20, 128)])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_the_steps_backward_and_reduction_at_the_target_shapes(n_rows, n_dim, dtype):
    keep = facts("backward-keep", dtype, n_dim, n_rows)
    assert keep["waves"] <= 1.0 and keep["grid"][0] <= keep["blocks_per_sm"] * 132
    assert keep["grid"][0] * 20 < n_rows  # a block a row would launch n_rows for nothing
    for reduction in report.reduction_rows(dtype, n_rows, n_dim):
        assert reduction["sass"]["load_rounds"] == 2
        assert reduction["bytes_in_flight_per_sm"] <= 128 * 1024


# 12. Float rows of 513 elements and more: two chunk pairs a thread (four 128-bit loads of x1 and
# x2 in its one round), four times what Little's law needs in flight, and the once-a-row work of
# a block's sums spread over twice the bytes. At 65536 x 768 on sm_90 the fused kernel's 96
# threads a block issue 2.4 instructions a DRAM byte, 31% of an H200's issue slots at the copy
# rate, where 192 threads of one pair issued 3.9 (50%) with 60 KB in flight an SM.
@pytest.mark.parametrize("name, n_dim", _on_every_nvrtc(
    [(name, n_dim) for name in ONE_BLOCK_PER_ROW for n_dim in (513, 768, 1024, 1536, 2048)],
    {("fused", n_dim) for n_dim in (513, 768, 1024, 1536, 2048)}))
def test_float_rows_from_513_hold_two_chunk_pairs_a_thread(name, n_dim):
    row = facts(name, "f32", n_dim)
    assert row["sass"]["loads"]["128"] == 4 and row["sass"]["load_rounds"] == 1, row["sass"]
    assert row["block"][0] <= 256 and row["occupancy"] >= 0.75
    assert row["bytes_in_flight_per_sm"] >= 4 * row["needed_bytes_in_flight_per_sm"], row


@pytest.mark.parametrize("name, most", [("fused", 0.35), ("backward", 0.35), ("forward", 0.40)])
def test_a_768_wide_float_row_takes_at_most_a_third_of_the_issue_slots(name, most):
    assert facts(name, "f32", 768)["issue_share_at_copy_rate"] <= most
