"""compile tier: the static report (cek.occupancy, cek.sass, cek.report and `cek compile --report`).

Occupancy is checked against answers worked by hand from NVIDIA's rules, the SASS counters
against small kernels in tests/sass/ whose answer is known, and the current kernels against ONE
table of pinned facts (KERNEL_FACTS) that kernel work is expected to move.
"""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from cek import report, sass
from cek.cli import main
from cek.compile import compile_kernel
from cek.kernel import kernel_classes
from cek.occupancy import occupancy

pytestmark = pytest.mark.compile

needs_nvdisasm = pytest.mark.skipif(sass.find_nvdisasm() is None, reason=sass.MISSING)
SASS_DIR = Path(__file__).parent / "sass"


# -- occupancy: worked by hand from cuda_occupancy.h's rules ----------------------------------
# Registers per warp = regs x 32 rounded up to 256; each of the 4 sub-partitions holds
# 65536 / 4 = 16384 registers, so warps per SM by registers = 4 x floor(16384 / per-warp), and
# blocks = floor(that / warps per block). Warps: 64 per SM; blocks: 32 per SM. Shared memory:
# (bytes rounded up to 128) + 1024 reserved per block, out of 164 KB (sm_80) or 228 KB (sm_90).
OCCUPANCY_EXAMPLES = [
    # arch, threads, regs, smem -> blocks/SM, warps/SM, limit
    # 32 regs: 1024 per warp, 16 warps per part, 64 per SM; 8 warps a block -> 8 = 64/8 warps too
    ("sm_90", 256, 32, 0, 8, 64, "registers+warps"),
    # 42 regs: 1344 -> 1536 per warp, 10 per part, 40 per SM; a 32-warp block -> 1 (50%)
    ("sm_90", 1024, 42, 0, 1, 32, "registers"),
    # 64 regs: 2048 per warp, 8 per part, 32 per SM; 4-warp blocks -> 8
    ("sm_80", 128, 64, 0, 8, 32, "registers"),
    # 40 regs: 1280 per warp, floor(12.8) = 12 per part, 48 per SM; 3-warp blocks -> 16
    # (a whole-SM division, 65536 / (1280 x 3) = 17, would be wrong)
    ("sm_80", 96, 40, 0, 16, 48, "registers"),
    # 48 KB shared: 49152 + 1024 = 50176 per block; 167936 / 50176 = 3 on sm_80
    ("sm_80", 256, 16, 48 * 1024, 3, 24, "shared"),
    # ... and 233472 / 50176 = 4 on sm_90
    ("sm_90", 256, 16, 48 * 1024, 4, 32, "shared"),
    # one-warp blocks: 32 blocks per SM at most, 32 warps (50%)
    ("sm_90", 32, 16, 0, 32, 32, "blocks"),
    # 255 regs: 8160 -> 8192 per warp, 2 per part, 8 per SM; 2-warp blocks -> 4
    ("sm_90", 64, 255, 0, 4, 8, "registers"),
    # 100 bytes of shared round up to 128 (+1024): 233472 / 1152 = 202, no limit here
    ("sm_90", 1024, 32, 100, 2, 64, "registers+warps"),
    # 1024 threads x 72 regs: 2304 per warp x 32 warps > 65536, the block cannot launch
    ("sm_90", 1024, 72, 0, 0, 0, "registers"),
]


@pytest.mark.parametrize("arch, threads, regs, smem, blocks, warps, limit", OCCUPANCY_EXAMPLES)
def test_occupancy_worked_examples(arch, threads, regs, smem, blocks, warps, limit):
    o = occupancy(arch, threads, regs, smem)
    assert (o.blocks_per_sm, o.warps_per_sm, o.limit) == (blocks, warps, limit)
    assert o.occupancy == warps / 64


@pytest.mark.parametrize("args, word", [(("sm_70", 256, 32), "arch"), (("sm_90", 0, 32), "threads"),
                                        (("sm_90", 2048, 32), "threads"),
                                        (("sm_90", 256, 300), "registers")])
def test_occupancy_rejects_bad_input(args, word):
    with pytest.raises(ValueError, match=word):
        occupancy(*args)


def test_waves_and_last_wave():
    # 10 blocks/SM x 132 SMs = 1320 a wave; 65536 = 49 x 1320 + 856, so 49.648 waves and the
    # last one fills 856 / 1320 = 64.8% of the slots.
    count, last = report.waves(65536, 10, 132)
    assert count == pytest.approx(65536 / 1320)
    assert last == pytest.approx(856 / 1320)
    assert report.waves(2640, 10, 132) == (2.0, 1.0)


def test_little_law_target():
    # H200: 400 cycles / 1.98 GHz = 202.0 ns; x 4.8 TB/s = 969,697 bytes over 132 SMs = 7346.2
    assert report.little_bytes_per_sm(report.GPUS["h200"]) == 7347
    # H100 SXM: the same 202.0 ns x 3.35 TB/s = 676,768 bytes over 132 SMs = 5127.0
    assert report.little_bytes_per_sm(report.GPUS["h100"]) == 5128
    # A100: 400 / 1.41 GHz = 283.7 ns; x 2.0 TB/s = 567,376 bytes over 108 SMs = 5253.5
    assert report.little_bytes_per_sm(report.GPUS["a100"]) == 5254


def test_bytes_in_flight_count_a_rows_labels_once():
    # 40 bytes a thread before its first wait, 8 of them y[row] and dy[row]: 10 blocks of 192
    # threads, one row each, have 10 x (32 x 192 + 8) in flight; row groups of 8 lanes, 32 rows
    # a 256-thread block, 8 blocks: 8 x (32 x 256 + 8 x 32).
    facts = {"first_round_bytes": 40, "first_round_narrow_bytes": 8}
    assert report.bytes_in_flight(facts, 192, 1, 10) == 10 * (32 * 192 + 8)
    assert report.bytes_in_flight(facts, 256, 32, 8) == 8 * (32 * 256 + 8 * 32)


# -- SASS counters ----------------------------------------------------------------------------

def _facts(stem: str) -> sass.SassFacts:
    path = SASS_DIR / f"{stem}.cu"
    compiled = compile_kernel(SimpleNamespace(id=stem, source=path.read_text()), "sm_90")
    return sass.facts(sass.disassemble(compiled.cubin))


@needs_nvdisasm
@pytest.mark.parametrize("stem, loads, stores, rounds, shuffles, barriers", [
    ("one_vector_load", {128: 1}, {32: 1}, 1, 0, 0),   # LDG.E.128 then use: 1 round
    ("pointer_chase", {32: 2}, {32: 1}, 2, 0, 0),      # x[next[i]]: 2 rounds
    ("scalar_load", {32: 1}, {32: 1}, 1, 0, 0),        # LDG.E, 32 bits
    ("warp_sum", {32: 1}, {32: 1}, 1, 5, 0),           # 16, 8, 4, 2, 1
    ("two_barriers", {32: 1}, {32: 1}, 1, 0, 2),
    ("rare_branch", {32: 1}, {32: 1}, 1, 0, 0),        # the reload behind the PMTRIG left out
])
def test_sass_counters_on_known_kernels(stem, loads, stores, rounds, shuffles, barriers):
    f = _facts(stem)
    assert (f.loads, f.stores, f.load_rounds) == (loads, stores, rounds)
    assert (f.shuffles, f.barriers, f.local_loads, f.local_stores) == (shuffles, barriers, 0, 0)
    assert f.load_bytes == sum(bits // 8 * n for bits, n in loads.items())


@needs_nvdisasm
def test_shuffles_are_not_integer_alu():
    # warp_sum's integer instructions are its three address computations: i = blockIdx.x *
    # blockDim.x + threadIdx.x (an IMAD) and x + i, out + i (two IMAD.WIDE); its five SHFL.BFLY
    # go to the shuffle count only (a prefix match on "SHF" took them for shifts: 8).
    f = _facts("warp_sum")
    assert (f.int_alu, f.shuffles) == (3, 5)
    assert [sass.is_int_alu(op) for op in ("SHFL.BFLY", "SHF.L.U32", "IADD3", "LOP3.LUT",
                                           "IMAD.WIDE", "FADD.FTZ", "USHF.R.U32.HI")] == [
        False, True, True, True, True, False, False]


# A hand-written listing in nvdisasm's form: a 128-bit load; a rare block (a PMTRIG, which
# CEK_RARE_PATH() compiles to) of scalar loads, reached by a conditional branch and falling
# through to the join; then y[row] and dy[row] issued after the first use of x. The rare block
# and the trap loop after EXIT (reached from nowhere) must not count, y and dy must (round 2).
LISTING = """
        /*0000*/                   LDG.E.128.CONSTANT R4, desc[UR4][R4.64] ;
        /*0010*/              @!P0 BRA `(.L_x_2) ;
        /*0020*/                   BRA `(.L_x_1) ;
.L_x_2:
        /*0030*/                   PMTRIG 0x1 ;
        /*0040*/              @!P1 LDG.E R6, desc[UR4][R10.64+0x8] ;
        /*0050*/                   LDG.E R4, desc[UR4][R10.64] ;
.L_x_1:
        /*0060*/                   FMUL R12, R4, R5 ;
        /*0070*/                   LDG.E.CONSTANT R14, desc[UR4][R18.64] ;
        /*0080*/                   LDG.E.CONSTANT R16, desc[UR4][R16.64] ;
        /*0090*/                   FADD R12, R14, R16 ;
        /*00a0*/                   NOP ;
        /*00b0*/                   EXIT ;
.L_x_3:
        /*00c0*/                   BRA `(.L_x_3);
"""


def test_rare_block_left_out_and_late_loads_counted():
    f = sass.facts(LISTING)
    assert f.loads == {128: 1, 32: 2}
    assert f.load_rounds == 2
    assert (f.first_round_bytes, f.first_round_narrow_bytes) == (16, 0)
    assert f.instructions == 8  # the rare block, the NOP and the trap loop left out


def test_listing_in_sm_80_syntax():
    # sm_80's listing writes the address as [R10.64+0x8], without sm_90's desc[UR4] prefix
    assert sass.facts(LISTING.replace("desc[UR4]", "")) == sass.facts(LISTING)


# The walk follows control flow: a branch on a condition operand (BRA !P1) falls through too;
# a rare block's predicated EXIT falls through into a block that only the rare one reaches, left
# out with it; a predicated PMTRIG (ptxas may predicate a short rare branch into ordinary code)
# marks nothing: its block runs on the ordinary path.
FLOW_LISTING = """
        /*0000*/                   LDG.E.128.CONSTANT R4, desc[UR4][R4.64] ;
        /*0010*/              @!P0 BRA !P1, `(.L_x_5) ;
        /*0020*/                   PMTRIG 0x1 ;
        /*0030*/                   STG.E.U16 desc[UR4][R8.64], R15 ;
        /*0040*/               @P2 EXIT ;
        /*0050*/                   STG.E.U16 desc[UR4][R8.64+0xe], R22 ;
        /*0060*/                   EXIT ;
.L_x_5:
        /*0070*/                   STG.E.128 desc[UR4][R20.64], R4 ;
        /*0080*/               @P3 PMTRIG 0x1 ;
        /*0090*/                   LDG.E.CONSTANT R14, desc[UR4][R8.64] ;
        /*00a0*/                   EXIT ;
"""


def test_walk_follows_branches_and_leaves_out_what_only_rare_code_reaches():
    blocks = sass.parse(FLOW_LISTING)
    assert [b.rare for b in blocks] == [False, True, False, False]
    assert sass.ordinary_path(blocks) == [blocks[0], blocks[3]]
    f = sass.facts(FLOW_LISTING)
    assert (f.stores, f.loads, f.instructions) == ({128: 1}, {128: 1, 32: 1}, 6)
    assert f.load_rounds == 2  # the STG reads R4..R7: a wait before y's load


# -- static_row and the CLI ------------------------------------------------------------------

@needs_nvdisasm
def test_static_row_is_one_json_row_with_every_fact():
    kernel = kernel_classes()["fused"].for_n_dim(768)
    row = report.static_row(kernel, 65536, 768, arch="sm_90", gpu="h200")
    assert json.loads(json.dumps(row)) == row
    assert row["grid"] == [65536, 1, 1] and row["block"] == [192, 1, 1]
    assert row["sass"]["loads"] == {"32": 2, "128": 2}  # y, dy; x1, x2: a 16-byte chunk each
    # two 16-byte chunks + y[row] + dy[row], all issued before the first use (one round)
    assert row["sass"]["first_round_bytes"] == 2 * 16 + 4 + 4
    assert row["sass"]["first_round_narrow_bytes"] == 4 + 4
    assert row["rows_per_block"] == 1
    assert row["bytes_in_flight_per_sm"] == row["blocks_per_sm"] * (32 * 192 + 8)


@pytest.mark.parametrize("kwargs, word", [({"arch": "sm_70"}, "arch"), ({"gpu": "v100"}, "gpu"),
                                          ({"arch": "sm_90", "gpu": "a100"}, "A100")])
def test_static_row_rejects_bad_arch_and_gpu(kwargs, word):
    with pytest.raises(ValueError, match=word):
        report.static_row(kernel_classes()["fused"].for_n_dim(768), 8, 768, **kwargs)


def test_static_row_rejects_a_non_kernel_and_a_wrong_width():
    with pytest.raises(TypeError, match="cek.Kernel"):
        report.static_row("fused", 8, 768)
    with pytest.raises(ValueError, match="block_size"):
        report.static_row(kernel_classes()["fused"].for_n_dim(768), 8, 4096)


@needs_nvdisasm
def test_cli_report_table_and_json():
    runner = CliRunner()
    table = runner.invoke(main, ["compile", "--report", "--kernel", "forward", "--n-dim", "768",
                                 "--n-rows", "1000"])
    assert table.exit_code == 0, table.output
    assert "rounds" in table.stdout and "cosine_embedding_loss_forward__f32__1024" in table.stdout
    out = runner.invoke(main, ["compile", "--report", "--kernel", "forward", "--n-dim", "768",
                               "--n-rows", "1000", "--gpu", "a100", "--arch", "sm_80", "--json"])
    assert out.exit_code == 0, out.output
    (row,) = json.loads(out.stdout)
    assert (row["gpu"], row["arch"], row["grid"][0]) == ("a100", "sm_80", 1000)
    assert row["sass"]["load_rounds"] >= 1


def test_cli_report_says_when_nvdisasm_is_missing(monkeypatch):
    monkeypatch.setattr(sass, "find_nvdisasm", lambda: None)
    out = CliRunner().invoke(main, ["compile", "--report", "--kernel", "forward", "--json"])
    assert out.exit_code == 0, out.output
    assert "nvdisasm not found" in out.stderr
    (row,) = json.loads(out.stdout)
    assert row["sass"] is None and "nvdisasm" in row["sass_missing"]
    assert row["registers"] > 0 and row["n_dim"] == 768  # the rest stands; default width 768


def test_cli_report_rejects_bad_n_rows():
    out = CliRunner().invoke(main, ["compile", "--report", "--n-rows", "0"])
    assert out.exit_code == 2 and "--n-rows" in out.output


# -- the current kernels: ONE table of pinned facts -------------------------------------------
# (kernel, dtype, n_dim) -> the report's columns below for 65536 rows on sm_90 / H200, read from
# the cubin that launches, on its ordinary aligned path (cek.sass.ordinary_path). Kernel work that
# changes a fact updates its entry here, from the report's output. Checked by hand against the
# SASS when pinned: the narrow loads are y[row] and dy[row] (2x32; the forward kernels read y
# only, double reads them as 64-bit), every chunk of x1 and x2 is one LDG.E.128 issued with them
# (rounds 1), and the block reduction's 30 shuffles are two warp sums of 3 values in 5 steps
# each (60 in double, two a value; a row group of 32 lanes does one: 15). At BLOCK_SIZE 8192 in
# float and 16-bit types (CekTiling::TAILED, 5888 runs 672 threads) a thread also loads and stores
# one element of x1, x2 past its chunks (2x32 or 2x16 more), at D = 8192 too, where no thread has
# one: the kernel is the same. backward-keep reads dy first, to know whether to read
# the row at all: 2 rounds, with only dy in flight in the first. The streamed fused kernel
# (2^20) is 4 loop bodies in a row: the sums' 4 pairs a trip and remainder, the gradient pass's
# 4 pairs and remainder.
FACT_COLUMNS = ("regs", "occ%", "limit", "waves", "ldg", "stg", "shfl", "bar", "rounds", "instr",
                "int", "inflight/SM")
KERNEL_FACTS = {
    ("fused", "f32", 768): (31, "94", "registers+warps", "49.65", "2x128 2x32", "2x128 1x32", 30, 1,
                            1, 227, 41, "60K"),
    ("fused", "f32", 8192): (32, "100", "registers+warps", "248.24", "4x128 4x32", "4x128 3x32", 30,
                             1, 1, 355, 49, "128K"),
    ("fused", "f32", 5888): (32, "98", "registers+warps", "165.49", "4x128 4x32", "4x128 3x32", 30,
                             1, 1, 355, 49, "126K"),
    ("fused", "bf16", 5888): (32, "98", "registers+warps", "165.49", "2x128 2x32 2x16",
                              "2x128 1x32 2x16", 30, 1, 1, 370, 91, "63K"),
    ("fused", "bf16", 768): (32, "98", "registers+warps", "23.64", "2x128 2x32", "2x128 1x32", 30,
                             1, 1, 300, 45, "63K"),
    ("fused", "bf16", 8192): (32, "100", "registers+warps", "248.24", "2x128 2x32 2x16",
                              "2x128 1x32 2x16", 30, 1, 1, 370, 91, "64K"),
    ("fused", "f64", 768): (40, "75", "registers", "124.12", "2x128 2x64", "2x128 1x64", 60, 1, 1,
                            342, 78, "48K"),
    ("fused", "f16", 768): (32, "98", "registers+warps", "23.64", "2x128 2x32", "2x128 1x32", 30, 1,
                            1, 286, 40, "63K"),
    ("fused", "f32", 128): (32, "100", "registers+warps", "7.76", "2x128 2x32", "2x128 1x32", 15, 0,
                            1, 207, 58, "64K"),
    ("fused", "f32", 1 << 20): (62, "50", "registers", "496.48", "20x128 2x32", "10x128 1x32", 30,
                                1, 4, 717, 245, "128K"),
    ("forward", "f32", 768): (26, "94", "registers+warps", "49.65", "2x128 1x32", "1x32", 30, 1, 1,
                              166, 26, "60K"),
    ("forward", "f32", 8192): (30, "100", "registers+warps", "248.24", "4x128 3x32", "1x32", 30, 1,
                               1, 226, 34, "128K"),
    ("forward", "bf16", 768): (27, "98", "registers+warps", "23.64", "2x128 1x32", "1x32", 30, 1,
                               1, 194, 43, "63K"),
    ("forward", "bf16", 8192): (30, "100", "registers+warps", "248.24", "2x128 1x32 2x16", "1x32",
                                30, 1, 1, 220, 61, "64K"),
    ("forward-rows", "f32", 128): (26, "100", "registers+warps", "7.76", "2x128 1x32", "1x32", 15,
                                   0, 1, 127, 29, "64K"),
    ("backward", "f32", 768): (30, "94", "registers+warps", "49.65", "2x128 2x32", "2x128", 30, 1,
                               1, 230, 26, "60K"),
    ("backward", "f32", 8192): (32, "100", "registers+warps", "248.24", "4x128 4x32", "4x128 2x32",
                                30, 1, 1, 335, 76, "128K"),
    ("backward", "bf16", 768): (32, "98", "registers+warps", "23.64", "2x128 2x32", "2x128", 30, 1,
                                1, 287, 47, "63K"),
    ("backward", "bf16", 8192): (32, "100", "registers+warps", "248.24", "2x128 2x32 2x16",
                                 "2x128 2x16", 30, 1, 1, 358, 96, "64K"),
    ("backward-rows", "f32", 128): (31, "100", "registers+warps", "7.76", "2x128 2x32", "2x128",
                                    15, 0, 1, 182, 47, "64K"),
    ("backward-keep", "f32", 128): (32, "100", "registers+warps", "7.76", "2x128 2x32", "2x128",
                                    15, 0, 2, 186, 50, "256B"),
    ("backward-keep", "f32", 768): (32, "94", "registers+warps", "49.65", "2x128 2x32", "2x128",
                                    30, 1, 2, 221, 44, "40B"),
    ("backward-keep", "bf16", 768): (32, "98", "registers+warps", "23.64", "2x128 2x32", "2x128",
                                     30, 1, 2, 283, 65, "84B"),
}


@needs_nvdisasm
@pytest.mark.exact_sass
@pytest.mark.parametrize("key", list(KERNEL_FACTS), ids=lambda k: "-".join(map(str, k)))
def test_kernel_facts_pinned(key):
    name, dtype, n_dim = key
    row = report.static_row(kernel_classes()[name].for_n_dim(n_dim, dtype), 65536, n_dim)
    shown = report.table_rows([row])[0]
    got = tuple(shown[column] for column in FACT_COLUMNS)
    assert got == KERNEL_FACTS[key], f"{key}: now {got}; update KERNEL_FACTS if this is intended"
    assert (shown["spill"], shown["lmem"], shown["ldl/stl"]) == (0, 0, "0/0")


@needs_nvdisasm
@pytest.mark.parametrize("name", ["fused", "backward-keep", "forward"])
def test_rare_code_is_in_the_cubin_and_left_out(name):
    # The huge-row branch and the misaligned fallback are in the code that launches, behind
    # PMTRIGs; the walk leaves them out: without that, their reloads of the row would show.
    kernel = kernel_classes()[name].for_n_dim(768)
    blocks = sass.parse(sass.disassemble(kernel.compile("sm_90").cubin))
    ordinary = sass.ordinary_path(blocks)
    assert sum(b.rare for b in blocks) >= 3  # the two loads' fallbacks and the huge-row branch
    every_load = sum(i.base == "LDG" for b in blocks for i in b)
    assert sum(i.base == "LDG" for b in ordinary for i in b) < every_load


DOC = Path(__file__).resolve().parents[1] / "docs" / "report.md"


@needs_nvdisasm
@pytest.mark.exact_sass
def test_documented_example_matches_the_report():
    """docs/report.md's example (fused, f32, 65536 x 768, sm_90, H200) is the report's row, field
    by field: rerun the command it names and paste its output when this fails."""
    text = DOC.read_text()
    block = text[text.index("```text", text.index("## Example")):]
    header, documented = block.splitlines()[1:3]
    cells = lambda line: re.split(r" {2,}", line.strip())  # noqa: E731 - cells hold single spaces
    row = report.static_row(kernel_classes()["fused"].for_n_dim(768), 65536, 768, arch="sm_90",
                            gpu="h200")
    shown = {name: str(value) for name, value in report.table_rows([row])[0].items()}
    assert cells(header) == list(shown)
    assert dict(zip(cells(header), cells(documented))) == shown
