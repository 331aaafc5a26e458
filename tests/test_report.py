"""compile tier: the static report (cek.occupancy, cek.sass, cek.report and `cek compile --report`).

Occupancy is checked against answers worked by hand from NVIDIA's rules, the SASS counters
against small kernels in tests/sass/ whose answer is known, and the current kernels against ONE
table of pinned facts (KERNEL_FACTS) that kernel work is expected to move.
"""

import json
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
    # H200: 400 cycles / 1.755 GHz = 227.9 ns; x 4.8 TB/s = 1,094,017 bytes over 132 SMs = 8288.0
    assert report.little_bytes_per_sm(report.GPUS["h200"]) == 8289
    # A100: 400 / 1.41 GHz = 283.7 ns; x 2.0 TB/s = 567,376 bytes over 108 SMs = 5253.5
    assert report.little_bytes_per_sm(report.GPUS["a100"]) == 5254


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
])
def test_sass_counters_on_known_kernels(stem, loads, stores, rounds, shuffles, barriers):
    f = _facts(stem)
    assert (f.loads, f.stores, f.load_rounds) == (loads, stores, rounds)
    assert (f.shuffles, f.barriers, f.local_loads, f.local_stores) == (shuffles, barriers, 0, 0)
    assert f.load_bytes == sum(bits // 8 * n for bits, n in loads.items())


# A hand-written listing in nvdisasm's form: a 128-bit load, a misaligned fallback of four
# scalar loads off one base, then y[row] and dy[row] (two narrow loads at offset 0 of two bases)
# issued after the first use: the fallback must not count, y and dy must (round 2).
LISTING = """
        /*0000*/                   LDG.E.128.CONSTANT R4, desc[UR4][R4.64] ;
        /*0010*/                   BRA `(.L_x_1) ;
.L_x_2:
        /*0020*/              @!P1 LDG.E R6, desc[UR4][R10.64+0x8] ;
        /*0030*/              @!P0 LDG.E R5, desc[UR4][R10.64+0x4] ;
        /*0040*/              @!P3 LDG.E R7, desc[UR4][R10.64+0xc] ;
        /*0050*/                   LDG.E R4, desc[UR4][R10.64] ;
.L_x_1:
        /*0060*/                   FMUL R12, R4, R5 ;
        /*0070*/                   LDG.E.CONSTANT R14, desc[UR4][R18.64] ;
        /*0080*/                   LDG.E.CONSTANT R16, desc[UR4][R16.64] ;
        /*0090*/                   FADD R12, R14, R16 ;
        /*00a0*/                   NOP ;
        /*00b0*/                   EXIT ;
"""


def test_fallback_left_out_and_late_loads_counted():
    f = sass.facts(LISTING)
    assert f.loads == {128: 1, 32: 2}
    assert f.load_rounds == 2
    assert f.first_round_bytes == 16
    assert f.instructions == 7  # NOP and the four fallback loads left out


def test_fallback_left_out_in_sm_80_syntax():
    # sm_80's listing writes the address as [R10.64+0x8], without sm_90's desc[UR4] prefix
    assert sass.facts(LISTING.replace("desc[UR4]", "")) == sass.facts(LISTING)


# A fallback store split by an early EXIT: its last element (offset 0xe, same base) sits in a
# block of its own and is left out too; a later y[row] at offset 0 off that same register (ptxas
# reuses it) still counts, after the wait on x.
SPLIT_LISTING = """
        /*0000*/                   LDG.E.128.CONSTANT R4, desc[UR4][R4.64] ;
        /*0010*/                   STG.E.128 desc[UR4][R20.64], R4 ;
        /*0020*/                   BRA `(.L_x_9) ;
.L_x_10:
        /*0030*/                   STG.E.U16 desc[UR4][R8.64], R15 ;
        /*0040*/              @!P6 STG.E.U16 desc[UR4][R8.64+0x2], R7 ;
.L_x_47:
        /*0050*/               @P2 EXIT ;
        /*0060*/                   STG.E.U16 desc[UR4][R8.64+0xe], R22 ;
.L_x_9:
        /*0070*/                   IMAD.WIDE R8, R3, 0x4, R8 ;
        /*0080*/                   LDG.E.CONSTANT R14, desc[UR4][R8.64] ;
        /*0090*/                   EXIT ;
"""


def test_fallback_split_by_exit_left_out_but_y_at_same_base_counted():
    f = sass.facts(SPLIT_LISTING)
    assert f.stores == {128: 1}
    assert f.loads == {128: 1, 32: 1}
    assert f.load_rounds == 2  # the STG read R4..R7: a wait before y's load


# -- static_row and the CLI ------------------------------------------------------------------

@needs_nvdisasm
def test_static_row_is_one_json_row_with_every_fact():
    kernel = kernel_classes()["fused"].for_n_dim(768)
    row = report.static_row(kernel, 65536, 768, arch="sm_90", gpu="h200")
    assert json.loads(json.dumps(row)) == row
    assert row["grid"] == [65536, 1, 1] and row["block"] == [192, 1, 1]
    assert row["sass"]["loads"]["128"] == 2  # x1 and x2, one 16-byte chunk each per thread
    # first-round bytes x resident threads: (two 16-byte chunks + y[row] + dy[row], all issued
    # before the first use) x (blocks/SM x 192)
    assert row["sass"]["first_round_bytes"] == 2 * 16 + 4 + 4
    assert row["bytes_in_flight_per_sm"] == 40 * row["blocks_per_sm"] * 192


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
# (kernel, dtype, n_dim) -> (registers, occupancy %, dependent load rounds, instructions/thread)
# on sm_90, SASS facts of the ordinary aligned row's path. Kernel work that changes a fact updates
# its entry here. Before the one-round rewrite a hand reading of the SASS and this table agreed:
# y[row] and dy[row] after the first use of x (2-4 rounds), bf16 fused ~470 instructions against
# f32's ~243 at D = 768, fused f32 at D = 8192 42 registers (50%).
KERNEL_FACTS = {
    ("fused", "f32", 768): (32, 94, 1, 203),
    ("fused", "f32", 8192): (40, 50, 1, 259),
    ("fused", "bf16", 768): (40, 75, 1, 258),
    ("fused", "bf16", 8192): (40, 50, 1, 258),
    ("forward", "f32", 768): (29, 94, 1, 151),
    ("forward", "f32", 8192): (32, 100, 1, 178),
    ("forward", "bf16", 768): (32, 98, 1, 179),
    ("forward", "bf16", 8192): (32, 100, 1, 179),
    ("backward", "f32", 768): (32, 94, 1, 179),
    ("backward", "f32", 8192): (48, 50, 1, 227),
    ("backward", "bf16", 768): (40, 75, 1, 233),
    ("backward", "bf16", 8192): (48, 50, 1, 233),
}


@needs_nvdisasm
@pytest.mark.parametrize("key", list(KERNEL_FACTS), ids=lambda k: "-".join(map(str, k)))
def test_kernel_facts_pinned(key):
    name, dtype, n_dim = key
    row = report.static_row(kernel_classes()[name].for_n_dim(n_dim, dtype), 65536, n_dim)
    got = (row["registers"], round(100 * row["occupancy"]), row["sass"]["load_rounds"],
           row["sass"]["instructions"])
    assert got == KERNEL_FACTS[key], f"{key}: now {got}; update KERNEL_FACTS if this is intended"
    assert row["sass"]["local_loads"] == row["sass"]["local_stores"] == 0
