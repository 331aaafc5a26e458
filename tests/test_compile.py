"""compile tier: every kernel at every BLOCK_SIZE compiles with NVRTC, no GPU, and no spills."""

import re

import pytest

import cek
from cek.dtypes import DTYPES
from cek.compile import CompileError, compile_kernel
from cek.kernel import Kernel, kernel_classes

pytestmark = pytest.mark.compile

# Every kernel at every BLOCK_SIZE in every dtype, for sm_80 and sm_90 (ptxas allocates
# registers per architecture: the half-precision row groups once spilled on sm_80 alone).
# A *_rows variant above the row-group width calls its twin's code, compiled here already.
CASES = [(cls, b, dtype, arch)
         for cls in kernel_classes().values() for dtype in DTYPES for b in cls.block_sizes()
         for arch in ("sm_80", "sm_90") if not cls(b, dtype).runs_twin_code]
VECTOR_LOAD = re.compile(r"ld\.global\.nc\.v(4\.[bsuf]32|2\.[bsuf]64)")
VECTOR_STORE = re.compile(r"st\.global\.v(4\.[bsuf]32|2\.[bsuf]64)")


@pytest.mark.parametrize("cls, block_size, dtype, arch", CASES,
                         ids=[f"{c.name.removeprefix('cosine_embedding_loss_')}-{d}-{b}-{a}"
                              for c, b, d, a in CASES])
def test_compiles_without_spills_or_local_memory(cls, block_size, dtype, arch):
    result = cls(block_size, dtype).compile(arch)
    assert result.cubin[:4] == b"\x7fELF"
    assert f".entry {cls(block_size).entry_point_name()}" in result.ptx
    assert (result.spill_stores, result.spill_loads, result.local_bytes) == (0, 0, 0), result.log
    assert result.stack_bytes == 0, result.log
    assert 0 < result.registers <= 64, result.log  # 1024 threads x 64 registers = one SM's file


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cls", list(kernel_classes().values()), ids=lambda c: c.name)
@pytest.mark.parametrize("block_size", [256, 1024, 1 << 20])
def test_vector_path_uses_128_bit_loads_and_stores(cls, dtype, block_size):
    ptx = cls(block_size, dtype).compile("sm_90").ptx
    assert VECTOR_LOAD.search(ptx)
    if "_forward" not in cls.name:  # the forward kernels store one value per row
        assert VECTOR_STORE.search(ptx)


def test_resource_report_is_parsed_from_ptxas():
    result = cek.CosineEmbeddingLossBackward(1024).compile("sm_90")
    assert "Used" in result.log and "registers" in result.log
    assert result.shared_bytes > 0  # the reduction's partial sums
    assert set(result.summary()) >= {"kernel_id", "registers", "spill_stores", "seconds"}


class _Broken(Kernel):
    name = "cosine_embedding_loss_forward"
    args = cek.CosineEmbeddingLossForward.args

    @property
    def kernel_source(self):
        return super().kernel_source.replace("if (threadIdx.x == 0) out[row]",
                                             "if (undeclared_name == 0) out[row]", 1)


def test_compile_error_carries_the_log_with_file_and_line():
    with pytest.raises(CompileError) as info:
        compile_kernel(_Broken(64), "sm_90")
    assert "undeclared_name" in info.value.log
    assert "cosine_embedding_loss_forward.cu(" in info.value.log


def test_arch_is_validated():
    with pytest.raises(ValueError, match="arch must look like sm_90, got 'compute_90'"):
        cek.CosineEmbeddingLossBackward(8).compile("compute_90")


class _MisTiled(cek.CosineEmbeddingLossFused):
    """Launches two chunks per thread where CekTiling holds one: a mirror out of step."""

    @property
    def chunks_per_thread(self):
        return 2


def test_compiler_refuses_a_tiling_mirror_out_of_step():
    with pytest.raises(CompileError) as info:
        compile_kernel(_MisTiled(1024), "sm_90")
    assert "cek/kernel.py and CekTiling disagree on CHUNKS" in info.value.log


def _nvdisasm():
    """nvdisasm from the nvidia-cuda-nvdisasm wheel, or on PATH."""
    import importlib.util
    import shutil
    from pathlib import Path

    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec else []):
        for path in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return str(path)
    found = shutil.which("nvdisasm")
    if not found:
        pytest.skip("nvdisasm (nvidia-cuda-nvdisasm) is not installed")
    return found


def sass(kernel, arch="sm_90"):
    """The kernel's SASS instructions, in order, without addresses."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.compile(arch).cubin)
        f.flush()
        text = subprocess.run([_nvdisasm(), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+([^;]*);", text)]


def aligned_path(kernel):
    """The kernel with its runtime alignment test and huge-row test answered "aligned, ordinary":
    the code an ordinary aligned row runs, with the other branches compiled away."""
    cls = type(kernel)

    class Aligned(cls):
        short_name = None

        @property
        def kernel_source(self):
            src = super().kernel_source
            for call in ("cek_vectorizable<T>(n_dim, x1, x2, dx1, dx2)",
                         "cek_vectorizable<T>(n_dim, x1, x2, x1, x2)"):
                src = src.replace(f"const bool vec = {call};", "const bool vec = true;")
            return src.replace("return s.sq1 < CekLimits<Acc>::BIG && s.sq2 < CekLimits<Acc>::BIG;",
                               "return true;")

    return Aligned(kernel.block_size, kernel.dtype)


REGISTER = re.compile(r"\bR(\d+)\b")


def load_rounds(ops):
    """Dependent rounds of global loads in straight-line SASS: a load starts a new round when
    some instruction since the previous load read a register a load had written (it waited)."""
    pending, rounds, waited = set(), 0, True
    for op in ops:
        opcode, _, operands = re.sub(r"^@!?U?P\w+\s+", "", op).partition(" ")
        regs = [int(r) for r in REGISTER.findall(operands)]
        if opcode.startswith("LDG"):
            rounds += waited
            waited = False
            width = 4 if ".128" in opcode else 2 if ".64" in opcode else 1
            pending.update(range(regs[0], regs[0] + width))
        elif pending & set(regs if opcode.startswith(("ST", "BRA", "EXIT")) else regs[1:]):
            waited, pending = True, set()
    return rounds


# One load round per row on the aligned path: every chunk of x1 and x2 a thread owns, and y and
# dy, issued before the first loaded value is used. Measured on sm_90 for D <= 16384; where
# ptxas still staggers the loads (the f16 fused kernel sinks y behind the conversions, the
# forward kernel at 4 chunks a thread interleaves its sums, some row groups) the case is left out
# and listed in docs/design.md, so that a fix shows up here as a new case to add.
ROUND_CASES = [(name, dtype, n_dim) for name in ("forward", "backward", "fused")
               for dtype in ("f32", "f64", "bf16") for n_dim in (768, 4096)] + [
    ("backward", "f16", 768), ("forward", "f16", 4096), ("fused", "f32", 8192),
    ("forward-rows", "f32", 128)]


@pytest.mark.parametrize("name, dtype, n_dim", ROUND_CASES)
def test_aligned_path_loads_each_row_in_one_round(name, dtype, n_dim):
    ops = sass(aligned_path(kernel_classes()[name].for_n_dim(n_dim, dtype)))
    assert load_rounds(ops) == 1
    first_shuffle = next(i for i, op in enumerate(ops) if "SHFL" in op)
    assert not any("LDG" in op for op in ops[first_shuffle:])  # y and dy before the reduction


def test_load_rounds_counts_a_dependent_load():
    assert load_rounds(["LDG.E R4, desc[UR4][R2.64]", "LDG.E R5, desc[UR4][R6.64]",
                        "FADD R7, R4, R5"]) == 1
    assert load_rounds(["LDG.E R4, desc[UR4][R2.64]", "FADD R7, R4, R4",
                        "LDG.E R5, desc[UR4][R6.64]"]) == 2


def occupancy(registers, threads, shared_bytes):
    """Theoretical occupancy on sm_90 by NVIDIA's rules: 64 warps and 32 blocks an SM, 65536
    registers allocated 256 a warp, 228 KB of shared memory with 1 KB reserved a block."""
    warps = -(-threads // WARP_SIZE)
    registers_per_warp = -(-registers * WARP_SIZE // 256) * 256
    blocks = min(32, 64 // warps, 65536 // registers_per_warp // warps,
                 228 * 1024 // (shared_bytes + 1024))
    return blocks * warps / 64


WARP_SIZE = 32
# Full occupancy in float, at least 3/4 in bfloat16, at the block size each launch takes at
# most (__launch_bounds__ with a minimum of blocks). Not reached, as measured on sm_90: D = 8192
# in float (two chunk pairs a thread, 40 registers) and bfloat16 (1024 threads would need 32
# registers), row groups holding two
# chunk pairs a lane (float 256, bfloat16 384), and one-warp blocks (D <= 128) of the
# one-block-per-row kernels, held to 32 blocks an SM: the row-group variants serve those rows.
OCCUPANCY_CASES = [(name, dtype, n_dim) for name in ("forward", "backward", "fused")
                   for dtype in ("f32", "bf16") for n_dim in (384, 768, 1024, 2048, 4096)
                   if (name, dtype, n_dim) != ("fused", "bf16", 384)] + [
    (name, dtype, 128) for name in ("forward-rows", "backward-rows", "fused")
    for dtype in ("f32", "bf16")]


@pytest.mark.parametrize("name, dtype, n_dim", OCCUPANCY_CASES)
def test_register_path_reaches_three_quarters_occupancy(name, dtype, n_dim):
    kernel = kernel_classes()[name].for_n_dim(n_dim, dtype)
    result = kernel.compile("sm_90")
    want = 1.0 if dtype == "f32" else 0.75
    assert occupancy(result.registers, kernel.max_threads, result.shared_bytes) >= want, (
        result.registers, kernel.max_threads)


def test_occupancy_follows_nvidias_rules():
    assert occupancy(32, 1024, 0) == 1.0
    assert occupancy(42, 1024, 0) == 0.5  # 48 allocated: one 1024-thread block
    assert occupancy(40, 128, 384) == 0.75  # 12 blocks of 4 warps


INTEGER_ALU = re.compile(r"(IADD3|IMAD|LOP3|SHF|PRMT|ISETP|SEL|LEA|IABS|IMNMX|VIMNMX|BMSK|POPC|"
                         r"FLO|SHL|SHR)\b")


def _counts(name, dtype, n_dim):
    ops = sass(aligned_path(kernel_classes()[name].for_n_dim(n_dim, dtype)))
    opcodes = [re.sub(r"^@!?U?P\w+\s+", "", op).split(" ")[0] for op in ops]
    return len(ops), sum(bool(INTEGER_ALU.match(op)) for op in opcodes)


@pytest.mark.parametrize("dtype, packed", [("bf16", "cvt.rn.bf16x2.f32"),
                                           ("f16", "cvt.rn.f16x2.f32")])
@pytest.mark.parametrize("name", ["fused", "backward", "backward-rows"])
def test_16_bit_gradients_round_two_values_an_instruction(name, dtype, packed):
    assert packed in kernel_classes()[name].for_n_dim(128, dtype).compile("sm_80").ptx


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_16_bit_fused_kernel_costs_about_what_float_does(dtype):
    # A 16-bit thread holds twice the elements of a float thread in its 16-byte chunks; the
    # conversions must not make that cost more than 1.5x the instructions, 2x the integer ones.
    total, integer = _counts("fused", dtype, 768)
    total_f32, integer_f32 = _counts("fused", "f32", 768)
    assert total <= 1.5 * total_f32 and integer <= 2 * integer_f32, (
        total, total_f32, integer, integer_f32)


@pytest.mark.parametrize("name", ["forward", "backward", "fused"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_streamed_path_keeps_four_chunk_pairs_in_flight(name, dtype):
    ops = sass(aligned_path(kernel_classes()[name].for_n_dim(1 << 20, dtype)))
    first_math = next(i for i, op in enumerate(ops) if re.match(r"(@!?P\d\s+)?(FFMA|FMUL)", op))
    assert sum("LDG.E.128" in op for op in ops[:first_math]) >= 2 * 4
