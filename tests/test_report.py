"""compile tier: the static report (cek.occupancy, cek.sass, cek.report and `cek compile --report`).

Occupancy is checked against answers worked by hand from NVIDIA's rules, the SASS counters
against small kernels in tests/sass/ whose answer is known, and the current kernels against ONE
table of pinned facts (KERNEL_FACTS) that kernel work is expected to move.
"""

import json
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from cek import report, sass
from cek.cli import main
from cek.compile import compile_kernel
from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
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
    # Copy bandwidth x loaded latency over the SMs. H200: 4.3 TB/s x 700 ns = 3,010,000 bytes
    # over 132 SMs = 22,803.03; the 400-cycle unloaded latency at the 4.8 TB/s peak gave 7347.
    assert report.little_bytes_per_sm(report.GPUS["h200"]) == 22804
    # H100 SXM (estimates): 3.0 TB/s x 700 ns = 2,100,000 bytes / 132 = 15,909.09
    assert report.little_bytes_per_sm(report.GPUS["h100"]) == 15910
    # A100 (estimates): 1.8 TB/s x 700 ns = 1,260,000 bytes / 108 = 11,666.67
    assert report.little_bytes_per_sm(report.GPUS["a100"]) == 11667
    # the copy H200's figure rests on: 8.6 GB read and written in 2.0 ms
    assert report.GPUS["h200"].copy_bytes_per_s == pytest.approx(8.6e9 / 2.0e-3)


def test_the_report_shows_the_little_law_target():
    row = report.static_row(kernel_classes()["fused"].for_n_dim(768), 65536, 768)
    assert row["needed_bytes_in_flight_per_sm"] == 22804
    assert report.table_rows([row])[0]["need/SM"] == "22K"  # 22804 / 1024 = 22.3


def test_bytes_in_flight_count_a_rows_labels_once():
    # 40 bytes a thread before its first wait, 8 of them y[row] and dy[row]: 10 blocks of 192
    # threads, one row each, have 10 x (32 x 192 + 8) in flight; row groups of 8 lanes, 32 rows
    # a 256-thread block, 8 blocks: 8 x (32 x 256 + 8 x 32).
    facts = {"first_round_bytes": 40, "first_round_narrow_bytes": 8, "first_round_l2_bytes": 0}
    assert report.bytes_in_flight(facts, 192, 1, 10) == 10 * (32 * 192 + 8)
    assert report.bytes_in_flight(facts, 256, 32, 8) == 8 * (32 * 256 + 8 * 32)
    # 16 bytes more that read L2 (the split's partials): not counted
    facts.update(first_round_bytes=56, first_round_l2_bytes=16)
    assert report.bytes_in_flight(facts, 1024, 1, 2) == 2 * (32 * 1024 + 8)


def test_resident_blocks_are_those_the_launch_has_for_an_sm():
    # 10 fit an SM: 65536 blocks fill them, 66 over 132 SMs leave one at most on each, 1320 ten
    assert report.resident_blocks(65536, 10, 132) == 10
    assert report.resident_blocks(66, 10, 132) == 1
    assert report.resident_blocks(1, 2, 132) == 1
    assert report.resident_blocks(1320, 10, 132) == 10
    assert report.resident_blocks(1321, 10, 132) == 10  # the 1321st waits for a slot


# -- SASS counters ----------------------------------------------------------------------------

def _listing(stem: str) -> tuple[str, sass.Marks]:
    """The SASS of tests/sass/<stem>.cu and the rare code its source marks."""
    source = (SASS_DIR / f"{stem}.cu").read_text()
    compiled = compile_kernel(SimpleNamespace(id=stem, source=source), "sm_90")
    return sass.disassemble(compiled.cubin), sass.Marks.from_source(source, f"{stem}.cu")


def _facts(stem: str) -> sass.SassFacts:
    return sass.facts(*_listing(stem))


@needs_nvdisasm
@pytest.mark.parametrize("stem, loads, stores, rounds, shuffles, barriers", [
    ("one_vector_load", {128: 1}, {32: 1}, 1, 0, 0),   # LDG.E.128 then use: 1 round
    ("pointer_chase", {32: 2}, {32: 1}, 2, 0, 0),      # x[next[i]]: 2 rounds
    ("scalar_load", {32: 1}, {32: 1}, 1, 0, 0),        # LDG.E, 32 bits
    ("warp_sum", {32: 1}, {32: 1}, 1, 5, 0),           # 16, 8, 4, 2, 1
    ("two_barriers", {32: 1}, {32: 1}, 1, 0, 2),
    ("rare_branch", {32: 1}, {32: 1}, 1, 0, 0),        # the marked reload left out
    ("rare_after_return", {32: 1}, {32: 1}, 1, 0, 0),  # ... in the other form
])
def test_sass_counters_on_known_kernels(stem, loads, stores, rounds, shuffles, barriers):
    f = _facts(stem)
    assert (f.loads, f.stores, f.load_rounds) == (loads, stores, rounds)
    assert (f.shuffles, f.barriers, f.local_loads, f.local_stores) == (shuffles, barriers, 0, 0)
    assert f.load_bytes == sum(bits // 8 * n for bits, n in loads.items())


@needs_nvdisasm
@pytest.mark.parametrize("stem", ["rare_branch", "rare_after_return"])
def test_the_marks_alone_leave_the_rare_reload_out(stem):
    # CEK_RARE_PATH() is nothing in the code: ptxas predicates these short branches into the
    # ordinary block (@P0 LDG ...), where they are issued but, for an ordinary row, move nothing.
    # The listing is the same without the marker; read without the marks, the reload counts
    # (two loads, 2 rounds), so the marks are what leave it out.
    listing, marks = _listing(stem)
    source = (SASS_DIR / f"{stem}.cu").read_text()
    unmarked = source.replace("CEK_RARE_PATH();", " " * len("CEK_RARE_PATH();"))
    compiled = compile_kernel(SimpleNamespace(id=stem, source=unmarked), "sm_90")
    assert sass.disassemble(compiled.cubin) == listing
    assert not any(i.base == "PMTRIG" for b in sass.parse(listing) for i in b)
    f = sass.facts(listing)
    assert (f.loads, f.load_rounds) == ({32: 2}, 2)
    marked = sass.facts(listing, marks)
    assert (marked.loads, marked.load_rounds, marked.instructions) == ({32: 1}, 1, f.instructions)


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


# Hand-written listings in nvdisasm -gi's form, with the source whose lines they name.
SOURCE = """\
#define CEK_RARE_PATH()
extern "C" __global__ void listing(const float4* x, const float* y, float* out) {
    float4 v = x[0];
    if (v.x < 0.0f) {
        CEK_RARE_PATH();  // a reload
        v.y = y[2] + y[3];
    }
    out[0] = v.x * v.y + y[0] + y[1];
}
"""
MARKS = sass.Marks.from_source(SOURCE, "listing.cu")


def _at(line: int) -> str:
    return f'        //## File "/build/listing.cu", line {line}'


# A 128-bit load; the rare branch (line 6), reached by a conditional branch on its `if` (line 4)
# and falling through to the join; then y[0] and y[1] issued after the first use of x. The rare
# block and the trap loop after EXIT (reached from nowhere) must not count, y and dy must
# (round 2).
LISTING = f"""
{_at(3)}
        /*0000*/                   LDG.E.128.CONSTANT R4, desc[UR4][R4.64] ;
{_at(4)}
        /*0010*/              @!P0 BRA `(.L_x_2) ;
        /*0020*/                   BRA `(.L_x_1) ;
.L_x_2:
{_at(6)}
        /*0030*/              @!P1 LDG.E R6, desc[UR4][R10.64+0x8] ;
        /*0040*/                   LDG.E R4, desc[UR4][R10.64] ;
.L_x_1:
{_at(8)}
        /*0050*/                   FMUL R12, R4, R5 ;
        /*0060*/                   LDG.E.CONSTANT R14, desc[UR4][R18.64] ;
        /*0070*/                   LDG.E.CONSTANT R16, desc[UR4][R16.64] ;
        /*0080*/                   FADD R12, R14, R16 ;
        /*0090*/                   NOP ;
{_at(9)}
        /*00a0*/                   EXIT ;
.L_x_3:
        /*00b0*/                   BRA `(.L_x_3);
"""


def test_rare_block_left_out_and_late_loads_counted():
    f = sass.facts(LISTING, MARKS)
    assert f.loads == {128: 1, 32: 2}
    assert f.load_rounds == 2
    assert (f.first_round_bytes, f.first_round_narrow_bytes) == (16, 0)
    assert f.instructions == 8  # the rare block, the NOP and the trap loop left out
    # every block: the rare reload and the trap loop too
    assert (f.all_instructions, f.all_loads) == (11, {128: 1, 32: 4})
    assert sass.facts(LISTING).loads == {128: 1, 32: 4}  # without the marks


def test_listing_in_sm_80_syntax():
    # sm_80's listing writes the address as [R10.64+0x8], without sm_90's desc[UR4] prefix
    plain = LISTING.replace("desc[UR4]", "")
    assert sass.facts(plain, MARKS) == sass.facts(LISTING, MARKS)


L2_SOURCE = """\
__device__ float4 load_partial(const float4* p) {
    return p[threadIdx.x];
}
extern "C" __global__ void l2(const float4* x, const float4* p, const float* y, float* out) {
    float4 a = x[threadIdx.x], b = load_partial(p);
    out[0] = a.x + b.x + y[0];
}
"""


def _l2_at(line: int, inlined_at: int | None = None) -> str:
    at = "" if inlined_at is None else f' inlined at "/build/l2.cu", line {inlined_at}'
    return f'        //## File "/build/l2.cu", line {line}{at}'


# x's chunk, then the partial, a load inlined from load_partial (line 2), then y: one round.
L2_LISTING = f"""
{_l2_at(5)}
        /*0000*/                   LDG.E.128.CONSTANT R4, desc[UR4][R2.64] ;
{_l2_at(2, 5)}
{_l2_at(5)}
        /*0010*/                   LDG.E.128 R8, desc[UR4][R20.64] ;
{_l2_at(6)}
        /*0020*/                   LDG.E.CONSTANT R12, desc[UR4][R22.64] ;
        /*0030*/                   FADD R4, R4, R8 ;
        /*0040*/                   FADD R4, R4, R12 ;
        /*0050*/                   STG.E desc[UR4][R14.64], R4 ;
        /*0060*/                   EXIT ;
"""


def test_loads_of_an_l2_read_are_told_apart_in_the_first_round():
    marks = sass.Marks.from_source(L2_SOURCE, "l2.cu", l2_reads=("load_partial",))
    f = sass.facts(L2_LISTING, marks)
    assert (f.load_rounds, f.first_round_bytes) == (1, 16 + 16 + 4)
    assert (f.first_round_narrow_bytes, f.first_round_l2_bytes) == (4, 16)
    assert sass.facts(L2_LISTING).first_round_l2_bytes == 0  # without the name: a chunk


def test_instructions_keep_the_last_lines_printed():
    # nvdisasm prints a line group where the line changes; an instruction without one has the
    # lines of the one before it. A group gives the line, then one line more for each call it
    # was inlined at, outward.
    blocks = sass.parse(LISTING + '        //## File "/b/a.cu", line 7 inlined at "/b/c.cu", '
                        'line 2\n        //## File "/b/c.cu", line 2\n'
                        '        /*00c0*/                   EXIT ;\n')
    assert [i.where for i in blocks[0]] == [(("/build/listing.cu", 3),),
                                           (("/build/listing.cu", 4),)]
    assert blocks[3].instructions[1].where == (("/build/listing.cu", 8),)
    assert blocks[-1].instructions[0].where == (("/b/a.cu", 7), ("/b/c.cu", 2))


FLOW_SOURCE = """\
#define CEK_RARE_PATH()
extern "C" __global__ void flow(const float4* x, float4* out, unsigned short* half_out) {
    float4 v = x[0];
    if (v.x == v.x) {
        out[0] = v;
        return;
    }
    CEK_RARE_PATH();  // a NaN
    half_out[0] = 1; half_out[7] = 2;
}
"""


def _flow_at(line: int) -> str:
    return f'        //## File "/build/flow.cu", line {line}'


# The walk follows control flow: a branch on a condition operand (BRA !P1) falls through too.
# The rare side of the `if` (line 4) is the one whose code comes from the marked lines: here the
# fall-through, whose predicated EXIT falls into a block that only it reaches, left out with it.
# A marked store predicated into the ordinary block (an if-converted rare branch) is issued
# there, but for an ordinary row moves nothing.
FLOW_LISTING = f"""
{_flow_at(3)}
        /*0000*/                   LDG.E.128.CONSTANT R4, desc[UR4][R4.64] ;
{_flow_at(4)}
        /*0010*/              @!P0 BRA !P1, `(.L_x_5) ;
{_flow_at(9)}
        /*0020*/                   STG.E.U16 desc[UR4][R8.64], R15 ;
        /*0030*/               @P2 EXIT ;
        /*0040*/                   STG.E.U16 desc[UR4][R8.64+0xe], R22 ;
        /*0050*/                   EXIT ;
.L_x_5:
{_flow_at(5)}
        /*0060*/                   STG.E.128 desc[UR4][R20.64], R4 ;
{_flow_at(9)}
        /*0070*/               @P3 STG.E.U16 desc[UR4][R8.64], R3 ;
{_flow_at(5)}
        /*0080*/                   LDG.E.CONSTANT R14, desc[UR4][R8.64] ;
        /*0090*/                   EXIT ;
"""


def test_walk_follows_branches_and_leaves_out_what_only_rare_code_reaches():
    marks = sass.Marks.from_source(FLOW_SOURCE, "flow.cu")
    blocks = sass.parse(FLOW_LISTING)
    assert sass.ordinary_path(blocks, marks) == [blocks[0], blocks[3]]
    f = sass.facts(FLOW_LISTING, marks)
    assert (f.stores, f.loads, f.instructions) == ({128: 1}, {128: 1, 32: 1}, 6)
    assert f.load_rounds == 2  # the STG reads R4..R7: a wait before y's load
    assert f.all_stores == {16: 3, 128: 1}


MERGE_SOURCE = """\
#define CEK_RARE_PATH()
__device__ void put(float* p, float v, bool vec) {
    if (vec) {
        p[0] = v;
        return;
    }
    CEK_RARE_PATH();  // a misaligned view
    p[1] = v;
}
"""


def _merge_at(line: int) -> str:
    return f'        //## File "/build/merge.cu", line {line}'


# Where the compiler folded the rare `if` into another test (the branch's line is no decision),
# the walk does not take a conditional branch to a block that runs a marked store unpredicated.
# Where control falls into such a block without a condition, the store is one the compiler
# merged from both sides (keeping the rare one's line): ordinary code.
MERGE_LISTING = f"""
{_merge_at(2)}
        /*0000*/                   ISETP.NE.AND P0, PT, R2, RZ, PT ;
        /*0010*/               @P0 BRA `(.L_x_1) ;
{_merge_at(8)}
        /*0020*/                   STG.E desc[UR4][R6.64+0x4], R3 ;
        /*0030*/                   BRA `(.L_x_2) ;
.L_x_1:
{_merge_at(4)}
        /*0040*/                   IADD3 R5, R5, 0x1, RZ ;
        /*0050*/                   STG.E desc[UR4][R6.64], R5 ;
.L_x_2:
{_merge_at(8)}
        /*0060*/                   STG.E desc[UR4][R6.64+0x8], R3 ;
        /*0070*/                   EXIT ;
"""


def test_marked_memory_code_stops_a_conditional_branch_only():
    marks = sass.Marks.from_source(MERGE_SOURCE, "merge.cu")
    blocks = sass.parse(MERGE_LISTING)
    assert sass.ordinary_path(blocks, marks) == [blocks[0], blocks[2], blocks[3]]
    assert sass.facts(MERGE_LISTING, marks).stores == {32: 2}
    assert sass.facts(MERGE_LISTING).stores == {32: 3}


# -- where the source marks rare code ------------------------------------------------------------

def _marked(source: str) -> tuple[list[int], list[int]]:
    marks = sass.Marks.from_source(source, "k.cu")
    return sorted(n for _, n in marks.decisions), sorted(n for _, n in marks.regions)


def test_marks_take_the_if_that_opens_the_code_and_the_rest_of_its_scope():
    # the body of an `if` (a condition over two lines: both are the decision's), then the rest
    # of the scope after an `if` that returns, on one line or in braces; braces in comments and
    # the #define itself do not count
    assert _marked("""\
#define CEK_RARE_PATH()
void f(bool a, bool b) {
    if (a &&
        b) {  // {
        CEK_RARE_PATH();
        if (b) { g(); }
    }
    h();
}
""") == ([3, 4], [5, 6, 7])
    assert _marked("""\
int f(bool a) {
    if (a) return 1;

    CEK_RARE_PATH();  // }
    return 2;
}
int g() { return 0; }
""") == ([2], [4, 5, 6])
    assert _marked("""\
int f(bool a) {
    if (a) {
        return 1;
    }
    CEK_RARE_PATH();
    return 2;
}
""") == ([2], [5, 6, 7])


def test_marks_follow_line_directives():
    # the kernels' source is one text of several files, each opened by a #line directive
    marks = sass.Marks.from_source('#line 1 "kernels/a.cuh"\nvoid f(bool a) {\n'
                                   '    if (a) {\n        CEK_RARE_PATH();\n    }\n}\n'
                                   '#line 8 "kernels/b.cu"\nvoid g() {}\n', "b.cu")
    assert marks.decisions == {("kernels/a.cuh", 2): 1}
    assert set(marks.regions) == {("kernels/a.cuh", 3), ("kernels/a.cuh", 4)}
    assert marks.region(("/any/dir/kernels/a.cuh", 3)) == 1  # nvdisasm's path ends with the name
    assert marks.region(("/any/dir/kernels/xa.cuh", 3)) is None
    assert marks.region(("/any/dir/kernels/b.cu", 3)) is None


def test_marks_take_an_else_and_end_the_ifs_body_at_it():
    # `} else {`: the marker opens the else, whose `if` decides; a marker in the if's body marks
    # up to the `}` of `} else {`, not the else's body after it
    assert _marked("""\
void f(bool a) {
    if (a) {
        g();
    } else {
        CEK_RARE_PATH();
        h();
    }
    k();
}
""") == ([2], [5, 6, 7])
    assert _marked("""\
void f(bool a) {
    if (!a) {
        CEK_RARE_PATH();
        h();
    } else {
        g();
    }
}
""") == ([2], [3, 4, 5])


def test_l2_reads_are_the_lines_of_the_functions_definition():
    # the definition (its head over two lines, then its body), not a call, nor a declaration
    source = """\
__device__ float load_partial(const float* p,
                              int n) {
    return threadIdx.x < n ? p[threadIdx.x] : 0.0f;
}
__device__ float other(const float* p);
__device__ float f(const float* p) {
    return other(p) + load_partial(p, 3);
}
"""
    marks = sass.Marks.from_source(source, "k.cu", l2_reads=("load_partial", "other"))
    assert marks.l2_reads == {("k.cu", n): "load_partial" for n in (1, 2, 3, 4)}
    assert marks.l2_read(("/any/dir/k.cu", 3)) == "load_partial"
    assert marks.l2_read(("/any/dir/k.cu", 7)) is None
    assert sass.Marks.from_source(source, "k.cu").l2_reads == {}


def test_a_marker_without_its_if_is_refused():
    with pytest.raises(ValueError, match=r"k.cu:3: CEK_RARE_PATH\(\) must open"):
        sass.Marks.from_source("void f() {\n    g();\n    CEK_RARE_PATH();\n}\n", "k.cu")


# -- static_row and the CLI ------------------------------------------------------------------

@needs_nvdisasm
def test_static_row_is_one_json_row_with_every_fact():
    kernel = kernel_classes()["fused"].for_n_dim(768)
    row = report.static_row(kernel, 65536, 768, arch="sm_90", gpu="h200")
    assert json.loads(json.dumps(row)) == row
    assert row["grid"] == [65536, 1, 1] and row["block"] == [96, 1, 1]
    assert row["sass"]["loads"] == {"32": 2, "128": 4}  # y, dy; x1, x2: two 16-byte chunks each
    # four 16-byte chunks + y[row] + dy[row], all issued before the first use (one round)
    assert row["sass"]["first_round_bytes"] == 4 * 16 + 4 + 4
    assert row["sass"]["first_round_narrow_bytes"] == 4 + 4
    assert row["rows_per_block"] == 1
    assert row["bytes_in_flight_per_sm"] == row["blocks_per_sm"] * (64 * 96 + 8)
    assert row["reduction"] is None  # it writes the rows' losses; a mean is another launch
    assert (row["sass"]["all_fences"], row["sass"]["all_atomics"]) == (0, 0)


@needs_nvdisasm
def test_static_row_of_a_reduction():
    # one block adds 65536 float losses: 256 KB read, 4 bytes a row
    row = report.static_row(CosineEmbeddingLossReduce.for_dtype("f32"), 65536, 768)
    assert json.loads(json.dumps(row)) == row
    assert (row["grid"], row["block"], row["rows_per_block"]) == ([1, 1, 1], [1024, 1, 1], 65536)
    assert report.read_bytes(CosineEmbeddingLossReduce.for_dtype("f32"), 65536, 768) == 4 * 65536
    assert set(row["reduction"]) == {"blocks", "rows_per_block", "publishes_per_row",
                                     "tail_round_trips", "tail_bytes_in_flight_per_thread"}
    assert row["reduction"]["publishes_per_row"] == 0


# -- the figures against counts made by hand from the SASS ----------------------------------------

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def _instructions(listing: str) -> list[tuple[str, set]]:
    """(opcode, {(file name, line)}) of each instruction of an nvdisasm -gi listing, read with two
    regular expressions and nothing of cek.sass: the lines are those of the `//##` group printed
    last before it (its own, and those of the calls it was inlined at)."""
    out, group, fresh = [], set(), False
    for text in listing.splitlines():
        if "//##" in text:
            if not fresh:
                group, fresh = set(), True
            group |= {(Path(f).name, int(n)) for f, n in re.findall(r'"([^"]+)", line (\d+)', text)}
            continue
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", text)
        if m:
            fresh = False
            if not m.group(1).startswith("NOP"):
                out.append((m.group(1), group))
    return out


def _width(opcode: str) -> int:
    """Bits one LDG moves: LDG.E.128 128, LDG.E.64 64, LDG.E.U16 16, LDG.E 32."""
    parts = set(opcode.split("."))
    return next((bits for names, bits in (({"128"}, 128), ({"64"}, 64), ({"U16", "S16"}, 16),
                                          ({"U8", "S8"}, 8)) if names & parts), 32)


def _loads(listing: str) -> list[tuple[int, set]]:
    return [(_width(op), where) for op, where in _instructions(listing) if op.startswith("LDG")]


def _ldg(widths: Counter) -> str:
    """As the table's ldg column shows them: 8x128 3x32."""
    return " ".join(f"{n}x{bits}" for bits, n in sorted(widths.items(), reverse=True))


def _sm_90(kernel) -> str:
    return sass.disassemble(compile_kernel(kernel, "sm_90").cubin)


def _source_lines(file: str, text: str) -> set:
    """The lines of kernels/<file> that hold `text`, as (file name, line)."""
    lines = (KERNELS / file).read_text().splitlines()
    return {(file, n) for n, line in enumerate(lines, 1) if text in line}


def _rare_body(file: str) -> set:
    """The lines of kernels/<file> from its one CEK_RARE_PATH(); to the `}` that closes it."""
    lines = (KERNELS / file).read_text().splitlines()
    (first,) = [n for n, line in enumerate(lines, 1) if "CEK_RARE_PATH();" in line]
    last = next(n for n, line in enumerate(lines, 1) if n > first and line.strip() == "}")
    return {(file, n) for n in range(first, last + 1)}


@needs_nvdisasm
@pytest.mark.parametrize("dtype, vec, remainder", [("f32", 4, {32: 3}), ("f64", 2, {64: 1})])
def test_the_reductions_misaligned_fallback_is_rare(dtype, vec, remainder):
    # By source line: the loads inlined at the fallback that CEK_RARE_PATH() opens read a
    # misaligned loss element by element, the 8 chunks of a trip VEC elements each; every other
    # load is the ordinary path's: the main loop's 8 chunks, one LDG.E.128 each, and the
    # n_rows % VEC remainder's VEC - 1 elements. Its instructions are those the entry reaches
    # without entering the block of the PMTRIG the marker compiles to; a trip's chunks are one
    # round, the remainder's elements another.
    kernel = CosineEmbeddingLossReduce.for_dtype(dtype)
    listing = _sm_90(kernel)
    fallback = _rare_body("cosine_embedding_loss_reduce.cu")
    loads = _loads(listing)
    assert Counter(bits for bits, where in loads if where & fallback) == {128 // vec: 8 * vec}
    ordinary = Counter(bits for bits, where in loads if not where & fallback)
    assert ordinary == {128: 8, **remainder}
    blocks = sass.parse(listing)
    assert sum(i.base == "PMTRIG" for b in blocks for i in b) == 1
    shown = report.table_rows([report.static_row(kernel, 65536, 768)])[0]
    assert shown["ldg"] == _ldg(ordinary)
    assert shown["instr"] == sum(len(b) for b in _pmtrig_path(blocks))
    assert shown["rounds"] == 2


@needs_nvdisasm
def test_a_reductions_bytes_in_flight_are_its_one_blocks():
    # 65536 float losses, one block of 1024 threads on one SM: each thread has the 8 chunks of a
    # trip in flight, 16 bytes each (every LDG.E.128 of the cubin): 128 KB
    (row,) = report.reduction_rows("f32", 65536, 768)
    chunks = sum(bits == 128 for bits, _ in _loads(_sm_90(CosineEmbeddingLossReduce.for_dtype())))
    assert (row["grid"], row["block"], chunks) == ([1, 1, 1], [1024, 1, 1], 8)
    assert row["bytes_in_flight_per_sm"] == 1 * 1024 * 16 * chunks
    assert report.table_rows([row])[0]["inflight/SM"] == "128K"


class _SumsOneBlockAnSm(kernel_classes()["split-sums"]):
    """split-sums launched as a grid-stride kernel would be: given the device's SMs, a grid of
    at most one block an SM."""

    def launch_config(self, n_rows, n_dim, sms=None):
        (most, _, _), block, shared = super().launch_config(n_rows, n_dim)
        return (most if sms is None else min(most, sms), 1, 1), block, shared


@needs_nvdisasm
def test_waves_and_bytes_in_flight_are_those_of_the_grid_that_runs():
    # Every LDG.E.128 of split-sums is a chunk of x1 or x2 of its slices, all issued before the
    # first sum (its rare paths read element by element). Capped at one block an SM where two
    # fit, the grid is half a wave and an SM has one block's chunks in flight; the widest grid
    # of one row of 4096 floats is one block, on one SM.
    kernel = _SumsOneBlockAnSm.for_n_dim(1 << 20)
    chunks = sum(bits == 128 for bits, _ in _loads(_sm_90(kernel)))
    row = report.static_row(kernel, 48, 1 << 20)
    assert (row["grid"][0], row["blocks_per_sm"]) == (132, 2)
    assert row["waves"] == 132 / (2 * 132)
    assert row["bytes_in_flight_per_sm"] == 1 * 1024 * 16 * chunks
    one = report.static_row(kernel_classes()["split-sums"].for_n_dim(4096), 1, 4096)
    assert (one["grid"][0], one["blocks_per_sm"]) == (1, 2)
    assert one["bytes_in_flight_per_sm"] == 1 * 1024 * 16 * chunks


@needs_nvdisasm
@pytest.mark.parametrize("name", ["backward-split", "fused-split"])
def test_the_splits_partials_are_left_out_of_the_bytes_in_flight(name):
    # A block of the split's gradient kernels has in flight its slice's chunks, an LDG.E.128 a
    # chunk of x1 or x2 each thread, and y[row] and dy[row], narrow, once a block. Its row's
    # partials (cek_load_partial: 16 bytes for each thread t < S) come from L2, where the sums
    # launch wrote them: left out. By source line, the LDG.E.128 that are no partial's.
    kernel = kernel_classes()[name].for_n_dim(1 << 20)
    partial = _source_lines("cosine_embedding_loss_split.cu", "row_sums[threadIdx.x]")
    wide = [where for bits, where in _loads(_sm_90(kernel)) if bits == 128]
    chunks = sum(not where & partial for where in wide)
    assert 0 < chunks < len(wide)  # the partials' load (and the rare branch's reload) besides
    row = report.static_row(kernel, 48, 1 << 20)
    resident = min(row["blocks_per_sm"], -(-row["grid"][0] // 132))
    labels = row["bytes_in_flight_per_sm"] - resident * 1024 * 16 * chunks
    assert 0 < labels <= resident * 2 * 8  # y and dy: at most 8 bytes each
    assert report.table_rows([row])[0]["inflight/SM"] == f"{resident * 16 * chunks}K"


def test_reduction_facts_from_the_sass_facts():
    # one block: trips of the main loop (2 MB / (256 threads x 64 bytes) = 128) times its rounds,
    # and the rounds outside loops; 64 independent blocks: a 64th of that each, in parallel;
    # blocks that count themselves done with atomics: publishes per row, and no tail cek can find
    facts = {"fences": 0, "atomics": 0, "all_atomics": 0, "loop_bytes_in_flight": 64,
             "loop_rounds": 2, "straight_rounds": 1}
    one = report.reduction_facts(facts, 1, 256, 1 << 19, 2 << 20)
    assert (one["tail_round_trips"], one["publishes_per_row"]) == (128 * 2 + 1, 0)
    assert report.reduction_facts(facts, 64, 256, 1 << 13, 2 << 20)["tail_round_trips"] == 2 * 2 + 1
    facts.update(fences=1, atomics=1, all_atomics=1)
    many = report.reduction_facts(facts, 4096, 256, 16, 2 << 20)
    assert (many["tail_round_trips"], many["publishes_per_row"]) == (None, 2 / 16)


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


@needs_nvdisasm
def test_cli_report_shows_the_launches_of_a_mean_after_the_kernels_whose_losses_it_adds():
    args = ["compile", "--report", "--n-dim", "128", "--n-rows", str(1 << 20), "--json"]
    out = CliRunner().invoke(main, [*args, "--kernel", "fused", "--kernel", "forward-rows"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    # The fused kernel, the two levels of a million losses' mean (once for f32), forward-rows.
    assert [r["kernel"] for r in rows] == [
        "cosine_embedding_loss_fused", "cosine_embedding_loss_reduce",
        "cosine_embedding_loss_reduce", "cosine_embedding_loss_forward_rows"]
    assert [r["grid"][0] for r in rows[1:3]] == [32, 1]
    assert sum(r["reduction"]["tail_round_trips"] for r in rows[1:3]) <= 4
    out = CliRunner().invoke(main, [*args, "--kernel", "backward"])
    assert [r["kernel"] for r in json.loads(out.stdout)] == ["cosine_embedding_loss_backward"]


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
# (rounds 1), and the block reduction's shuffles are two warp sums of 3 values, the first in 5
# steps and the second in log2 of the block's most warps rounded up to a power of two
# (CekTiling::WARPS): 30 at 512 threads and more, 21 at 768 floats (96 to 128 threads: 2 steps),
# twice as many in double, two a value (a row group of 32 lanes does one: 15). `issue%` is the
# share of the H200's issue slots the launch takes to move its bytes at the copy rate. At
# BLOCK_SIZE 8192 in float and 16-bit types (CekTiling::TAILED, 5888 runs 672 threads) a thread
# also loads and stores one element of x1, x2 past its chunks (2x32 or 2x16 more), at D = 8192
# too, where no thread has one: the kernel is the same. backward-keep reads dy first, to know
# whether to read the row at all: 2 rounds, with only dy in flight in the first. The streamed fused
# kernel (2^20) is 4 loop bodies in a row: the sums' 4 pairs a trip and remainder, the gradient
# pass's 4 pairs and remainder. `rare` is every other instruction of the cubin (the misaligned
# fallbacks, the huge-row branches, the trap after EXIT); no kernel runs a fence or an atomic
# (`fence/atom`, every block): a mean or sum is a launch of its own (REDUCE_FACTS).
FACT_COLUMNS = ("regs", "occ%", "limit", "waves", "ldg", "stg", "shfl", "bar", "rounds", "instr",
                "int", "issue%", "inflight/SM", "rare", "fence/atom")
KERNEL_FACTS = {
    ("fused", "f32", 768): (32, "98", "registers+warps", "23.64", "4x128 2x32", "4x128 3x32", 21,
                            1, 1, 308, 39, "31", "126K", 343, "0/0"),
    ("fused", "f32", 8192): (32, "100", "registers+warps", "248.24", "4x128 4x32", "4x128 5x32",
                             30, 1, 1, 375, 65, "38", "128K", 351, "0/0"),
    ("fused", "f32", 5888): (32, "98", "registers+warps", "165.49", "4x128 4x32", "4x128 5x32", 30,
                             1, 1, 375, 65, "34", "126K", 351, "0/0"),
    ("fused", "bf16", 5888): (40, "75", "registers", "124.12", "4x128 1x32 1x16", "4x128 2x32 1x16",
                              27, 1, 1, 460, 144, "48", "96K", 530, "0/0"),
    ("fused", "bf16", 768): (63, "50", "registers", "15.52", "8x128 1x32 1x16", "8x128 2x32 1x16",
                             15, 0, 1, 650, 211, "43", "128K", 1161, "0/0"),
    ("fused", "bf16", 8192): (40, "75", "registers", "165.49", "4x128 1x32 1x16", "4x128 2x32 1x16",
                              27, 1, 1, 460, 144, "46", "96K", 530, "0/0"),
    ("fused", "f64", 768): (38, "75", "registers", "124.12", "2x128 2x64", "2x128 3x64", 54, 1, 1,
                            356, 89, "71", "48K", 450, "0/0"),
    ("fused", "f16", 768): (64, "50", "registers", "15.52", "8x128 1x32 1x16", "8x128 2x32 1x16",
                            15, 0, 1, 676, 99, "45", "128K", 1195, "0/0"),
    ("fused", "f32", 128): (40, "75", "registers", "5.17", "4x128 2x32", "4x128 3x32", 12, 0, 1,
                            257, 60, "26", "97K", 352, "0/0"),
    ("fused", "f32", 1 << 20): (60, "50", "registers", "496.48", "20x128 2x32", "10x128 3x32", 30,
                                1, 4, 734, 251, "-", "128K", 802, "0/0"),
    ("forward", "f32", 768): (30, "98", "registers+warps", "23.64", "4x128 1x32", "1x32", 21, 1, 1,
                              185, 23, "37", "126K", 207, "0/0"),
    ("forward", "f32", 8192): (30, "100", "registers+warps", "248.24", "4x128 3x32", "1x32", 30, 1,
                               1, 226, 34, "45", "128K", 226, "0/0"),
    ("forward", "bf16", 768): (26, "98", "registers+warps", "23.64", "2x128 1x32", "1x32", 21, 1,
                               1, 176, 43, "71", "63K", 203, "0/0"),
    ("forward", "bf16", 8192): (32, "100", "registers+warps", "124.12", "4x128 1x32", "1x32", 27, 1,
                                1, 245, 67, "49", "128K", 306, "0/0"),
    ("forward-rows", "f32", 128): (32, "100", "registers+warps", "3.88", "4x128 1x32", "1x32", 12,
                                   0, 1, 149, 37, "30", "128K", 167, "0/0"),
    ("backward", "f32", 768): (32, "98", "registers+warps", "23.64", "4x128 2x32", "4x128", 21, 1,
                               1, 281, 38, "28", "126K", 331, "0/0"),
    ("backward", "f32", 8192): (32, "100", "registers+warps", "248.24", "4x128 4x32", "4x128 2x32",
                                30, 1, 1, 335, 76, "34", "128K", 348, "0/0"),
    ("backward", "bf16", 768): (32, "98", "registers+warps", "23.64", "2x128 1x32 1x16", "2x128",
                                21, 1, 1, 267, 58, "54", "63K", 328, "0/0"),
    ("backward", "bf16", 8192): (38, "75", "registers", "165.49", "4x128 1x32 1x16", "4x128", 27, 1,
                                 1, 432, 125, "43", "96K", 514, "0/0"),
    ("backward-rows", "f32", 128): (39, "75", "registers", "5.17", "4x128 2x32", "4x128", 12, 0, 1,
                                    225, 48, "23", "97K", 352, "0/0"),
    ("backward-keep", "f32", 128): (40, "75", "registers", "1.00", "4x128 3x32", "4x128", 13, 0, 3,
                                    327, 63, "-", "384B", 442, "0/0"),
    ("backward-keep", "f32", 768): (37, "75", "registers", "1.00", "4x128 2x32", "4x128", 21, 3, 2,
                                    335, 85, "-", "64B", 415, "0/0"),
    ("backward-keep", "bf16", 768): (63, "50", "registers", "1.00", "8x128 1x32 2x16", "8x128", 16,
                                     0, 3, 716, 259, "-", "64B", 1162, "0/0"),
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
    # The huge-row branch and the misaligned fallbacks are in the code that launches, marked in
    # the source; the walk leaves them out, the launch-wide counts keep them: their reloads of
    # the row show there only.
    row = report.static_row(kernel_classes()[name].for_n_dim(768), 65536, 768)
    facts = row["sass"]
    assert facts["all_instructions"] > facts["instructions"]
    assert sum(facts["all_loads"].values()) > sum(facts["loads"].values())
    assert facts["all_loads"]["32"] > facts["loads"]["32"]  # element by element
    assert report.table_rows([row])[0]["rare"] == facts["all_instructions"] - facts["instructions"]


# The marks against the instruction CEK_RARE_PATH() was: compiled as a `pmevent` (a PMTRIG at the
# head of each rare branch, which ptxas neither moves nor merges with other code), the kernels'
# line marks leave out exactly the blocks behind the PMTRIGs. And the build without it has, on
# its ordinary path, the loads, stores, shuffles, barriers and load rounds of that build: the
# marks find the same path through code the compiler shaped freely.
MARKER_CASES = [("fused", "f32", 128), ("fused", "f32", 768), ("fused", "f32", 8192),
                ("fused", "bf16", 256), ("fused", "f64", 768), ("backward-keep", "f32", 128),
                ("backward-keep", "bf16", 768), ("backward", "bf16", 8192),
                ("forward", "f32", 1 << 20), ("forward-rows", "bf16", 128),
                ("backward-rows", "f64", 128), ("split-sums", "f32", 1 << 20)]
PMEVENT = 'asm volatile("pmevent 0;")'


def _define_marker(source: str, body: str) -> str:
    out, n = re.subn(r"^(\s*#\s*define\s+CEK_RARE_PATH\(\)).*$", rf"\1 {body}", source,
                     flags=re.M)
    assert n >= 1
    return out


def _pmtrig_path(blocks: list[sass.Block]) -> list[sass.Block]:
    """The blocks the entry reaches without entering one that runs a PMTRIG unpredicated."""
    by_label = {label: n for n, b in enumerate(blocks) for label in b.labels}
    seen, todo = set(), [0]
    while todo:
        n = todo.pop()
        if n in seen or any(i.base == "PMTRIG" and not i.conditional for i in blocks[n]):
            continue
        seen.add(n)
        if not blocks[n].instructions[-1].ends_flow and n + 1 < len(blocks):
            todo.append(n + 1)
        todo += [by_label[i.target] for i in blocks[n] if i.target in by_label]
    return [b for n, b in enumerate(blocks) if n in seen]


@needs_nvdisasm
@pytest.mark.parametrize("name, dtype, n_dim", MARKER_CASES)
def test_line_marks_leave_out_what_an_instruction_marker_does(name, dtype, n_dim):
    kernel = kernel_classes()[name].for_n_dim(n_dim, dtype)
    marks = sass.Marks.from_source(kernel.source, f"{kernel.id}.cu")
    listings = {}
    for body in (PMEVENT, ""):
        source = _define_marker(kernel.source, body)
        compiled = compile_kernel(SimpleNamespace(id=kernel.id, source=source), "sm_90")
        listings[body] = sass.disassemble(compiled.cubin)
    blocks = sass.parse(listings[PMEVENT])
    assert sum(i.base == "PMTRIG" for b in blocks for i in b) >= 3
    assert sass.ordinary_path(blocks, marks) == _pmtrig_path(blocks)
    assert not any(i.base == "PMTRIG" for b in sass.parse(listings[""]) for i in b)
    keys = ("loads", "stores", "shuffles", "barriers", "load_rounds", "first_round_bytes")
    instructed, free = (sass.facts(listings[b], marks).as_dict() for b in (PMEVENT, ""))
    assert {k: free[k] for k in keys} == {k: instructed[k] for k in keys}


# The launches that add n_rows losses into a mean or sum (report.reduction_rows), on sm_90 / H200:
# cosine_embedding_loss_reduce in one block up to 65536 float losses (32768 doubles), above that
# a block per slice of 32768 (16384) writing partials, then one block over those. Its main loop
# has eight 16-byte chunks a thread in flight a trip (the 8x128), one round a trip; the 3x32
# (1x64) are the n_rows % 4 (% 2) remainder, a second round. The loop that reads a misaligned
# loss element by element is the fallback CEK_RARE_PATH() marks, off the ordinary path (`rare`).
# tail: the trips a block makes, and the remainder's round.
REDUCE_COLUMNS = ("regs", "grid", "block", "ldg", "rounds", "instr", "pub/row", "tail")
REDUCE_FACTS = {
    ("f32", 65536): [(47, 1, 1024, "8x128 3x32", 2, 210, "0", 3)],
    ("f32", 1 << 20): [(47, 32, 1024, "8x128 3x32", 2, 210, "0", 2),
                       (47, 1, 1024, "8x128 3x32", 2, 210, "0", 2)],
    ("bf16", 65536): [(47, 1, 1024, "8x128 3x32", 2, 217, "0", 3)],
    ("f64", 65536): [(47, 4, 1024, "8x128 1x64", 2, 198, "0", 2),
                     (47, 1, 1024, "8x128 1x64", 2, 198, "0", 2)],
}


@needs_nvdisasm
@pytest.mark.exact_sass
@pytest.mark.parametrize("key", list(REDUCE_FACTS), ids=lambda k: "-".join(map(str, k)))
def test_reduction_facts_pinned(key):
    dtype, n_rows = key
    rows = report.reduction_rows(dtype, n_rows, 768)
    got = [tuple(shown[column] for column in REDUCE_COLUMNS) for shown in report.table_rows(rows)]
    assert got == REDUCE_FACTS[key], f"{key}: now {got}; update REDUCE_FACTS if this is intended"
    for row in rows:
        assert row["reduction"]["blocks"] == row["grid"][0]
        assert row["reduction"]["tail_bytes_in_flight_per_thread"] == 128
        assert (row["spill_stores"], row["spill_loads"]) == (0, 0)
    # the last launch adds what the first wrote: one partial a block
    assert rows[-1]["rows_per_block"] == (rows[0]["grid"][0] if len(rows) == 2 else n_rows)


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


# -- a disassembler that fails or does not finish ------------------------------------------------


def _tool(tmp_path, body: str) -> str:
    tool = tmp_path / "nvdisasm"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    return str(tool)


def test_a_disassembler_that_does_not_finish_is_stopped_and_named(tmp_path, monkeypatch):
    # NVRTC 12.0's sm_90 cubin of split-sums once made nvdisasm 13.5 -gi grow to 16 GB.
    monkeypatch.setattr(sass, "DISASSEMBLE_SECONDS", 1)
    tool = _tool(tmp_path, "sleep 30")
    with pytest.raises(sass.NvdisasmFailed, match=r"did not finish in 1 s"):
        sass.disassemble(b"\0", tool)


def test_a_disassembler_that_fails_says_what_it_said(tmp_path):
    tool = _tool(tmp_path, "echo 'bad cubin' >&2; exit 3")
    with pytest.raises(sass.NvdisasmFailed, match=r"failed \(3\): bad cubin"):
        sass.disassemble(b"\0", tool)


def test_the_disassembler_runs_with_its_address_space_capped(tmp_path, monkeypatch):
    monkeypatch.setattr(sass, "DISASSEMBLE_BYTES", 1 << 30)
    tool = _tool(tmp_path, "ulimit -v")
    assert sass.disassemble(b"\0", tool).strip() == str((1 << 30) // 1024)


def test_the_report_turns_a_failed_disassembler_into_an_error_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sass, "find_nvdisasm", lambda: _tool(tmp_path, "exit 7"))
    report._compiled.cache_clear()
    try:
        result = CliRunner().invoke(main, ["compile", "--report", "--kernel", "forward",
                                           "--n-dim", "64", "--n-rows", "8"])
    finally:
        report._compiled.cache_clear()
    assert result.exit_code == 1, result.output
    assert "failed (7)" in result.output and "Traceback" not in result.output


# -- issue%: the launch's instructions against the DRAM bytes it moves ---------------------------
@needs_nvdisasm
def test_issue_share_is_the_launchs_instructions_over_its_dram_bytes():
    kernel = kernel_classes()["fused"].for_n_dim(768)
    row = report.static_row(kernel, 65536, 768)
    threads = row["grid"][0] * row["block"][0]
    # The bytes of the training step's launch: x1, x2 read and dx1, dx2 written, y read, the loss
    # and the labels' copy written: 16 x 768 + 3 x 4 bytes a row.
    assert kernel.bytes_moved(65536, 768) == 65536 * (16 * 768 + 12)
    per_byte = row["sass"]["instructions"] * threads / (65536 * (16 * 768 + 12))
    assert row["instructions_per_dram_byte"] == pytest.approx(per_byte)
    # An H200 issues 132 SMs x 128 threads' instructions a cycle at 1.98 GHz.
    issue_per_s = 132 * 128 * 1.98e9
    assert row["issue_share_at_copy_rate"] == pytest.approx(per_byte * 4.3e12 / issue_per_s)
    shown = report.table_rows([row])[0]["issue%"]
    assert shown == f"{100 * row['issue_share_at_copy_rate']:.0f}"
    # A thread's own bytes count a row's y, dy and loss once for each thread that names them: more
    # bytes, fewer instructions a byte, than DRAM moves for it.
    assert row["instructions_per_byte"] < row["instructions_per_dram_byte"]


@needs_nvdisasm
def test_issue_share_is_left_out_where_a_loop_issues_its_body_once_a_trip():
    streamed = report.static_row(kernel_classes()["fused"].for_n_dim(1 << 20), 8, 1 << 20)
    keep = report.static_row(kernel_classes()["backward-keep"].for_n_dim(768), 65536, 768)
    rows = [streamed, keep, *report.reduction_rows("f32", 1 << 20, 128)]
    for row in rows:
        assert row["sass"]["loop_bytes_in_flight"] > 0, row["kernel_id"]
        assert row["issue_share_at_copy_rate"] is None
        assert row["instructions_per_dram_byte"] is None
        assert report.table_rows([row])[0]["issue%"] == "-"


def test_every_column_is_in_the_documented_table():
    """docs/report.md's table of columns names every column the report prints (alone, or with
    others in one cell: `regs, spill, lmem`)."""
    text = DOC.read_text()
    table = text[text.index("## The columns"):]
    named = {name.strip() for line in table.splitlines() if line.startswith("| ")
             for name in line.split("|")[1].split(",")}
    assert [name for name, _ in report.COLUMNS if name not in named] == []
