"""compile tier: every kernel at every BLOCK_SIZE compiles with NVRTC, no GPU, and no spills."""

import re

import pytest

import cek
from cek.dtypes import DTYPES
from cek.compile import CompileError, _nvrtc, compile_kernel, known_archs, nvrtc_options
from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
from cek.kernel import Kernel, kernel_classes

pytestmark = pytest.mark.compile

# Every kernel at every BLOCK_SIZE in every dtype, for sm_80 and sm_90 (ptxas allocates
# registers per architecture: the half-precision row groups once spilled on sm_80 alone).
# A *_rows variant above the row-group width calls its twin's code, compiled here already.
# The reduction of the losses, which the CLI does not list, has one BLOCK_SIZE.
CASES = [(cls, b, dtype, arch)
         for cls in [*kernel_classes().values(), CosineEmbeddingLossReduce]
         for dtype in DTYPES for b in cls.block_sizes()
         for arch in ("sm_80", "sm_90") if not cls(b, dtype).runs_twin_code]
VECTOR_LOAD = re.compile(r"ld\.global\.nc\.v(4\.[bsuf]32|2\.[bsuf]64)")
# .cs: the evict-first hint the split's gradient kernels store dx with (cek_store_chunk<true>)
VECTOR_STORE = re.compile(r"st\.global(\.cs)?\.v(4\.[bsuf]32|2\.[bsuf]64)")
STREAMING_STORE = re.compile(r"st\.global\.cs\.v(4\.[bsuf]32|2\.[bsuf]64)")


@pytest.mark.parametrize("cls, block_size, dtype, arch", CASES,
                         ids=[f"{c.name.removeprefix('cosine_embedding_loss_')}-{d}-{b}-{a}"
                              for c, b, d, a in CASES])
def test_compiles_without_spills_or_local_memory(cls, block_size, dtype, arch):
    result = compile_kernel(cls(block_size, dtype), arch)
    assert result.cubin[:4] == b"\x7fELF"
    assert f".entry {cls(block_size).entry_point_name()}" in result.ptx
    assert (result.spill_stores, result.spill_loads, result.local_bytes) == (0, 0, 0), result.log
    assert result.stack_bytes == 0, result.log
    assert "warning" not in result.log, result.log  # NVRTC's front end and ptxas say nothing
    assert 0 < result.registers <= 64, result.log  # 1024 threads x 64 registers = one SM's file


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("cls, block_size", [
    (cls, b) for cls in kernel_classes().values()
    for b in ([256, 1024, 1 << 20] if len(cls.block_sizes()) > 1 else cls.block_sizes())],
    ids=lambda v: v.name if isinstance(v, type) else str(v))
def test_vector_path_uses_128_bit_loads_and_stores(cls, dtype, block_size):
    ptx = compile_kernel(cls(block_size, dtype), "sm_90").ptx
    assert VECTOR_LOAD.search(ptx)
    if "_forward" not in cls.name:  # the forward kernels store one value per row
        assert VECTOR_STORE.search(ptx)
    # the split's gradient kernels store dx evict-first: their reverse walk reads the slices
    # again, which dx should not push out of L2; nothing else streams its stores
    streams = "_split_" in cls.name and cls.kind in ("backward", "fused")
    assert bool(STREAMING_STORE.search(ptx)) is streams


def test_resource_report_is_parsed_from_ptxas():
    result = compile_kernel(cek.CosineEmbeddingLossBackward(1024), "sm_90")
    assert "Used" in result.log and "registers" in result.log
    assert result.shared_bytes > 0  # the reduction's partial sums
    assert set(result.summary()) >= {"kernel_id", "registers", "spill_stores", "seconds"}


class _Broken(Kernel):
    name = "cosine_embedding_loss_forward"
    args = cek.CosineEmbeddingLossForward.args

    @property
    def kernel_source(self):
        source = super().kernel_source
        assert "if (threadIdx.x == 0) out[row]" in source
        return source.replace("if (threadIdx.x == 0) out[row]",
                              "if (undeclared_name == 0) out[row]", 1)


def test_compile_error_carries_the_log_with_file_and_line():
    with pytest.raises(CompileError) as info:
        compile_kernel(_Broken(64), "sm_90")
    assert "undeclared_name" in info.value.log
    assert "cosine_embedding_loss_forward.cu(" in info.value.log


def test_arch_is_validated():
    with pytest.raises(ValueError, match="arch must look like sm_90, got 'compute_90'"):
        compile_kernel(cek.CosineEmbeddingLossBackward(8), "compute_90")


class _MisTiled(cek.CosineEmbeddingLossFused):
    """Launches one chunk more per thread than CekTiling holds: a mirror out of step."""

    @property
    def chunks_per_thread(self):
        return super().chunks_per_thread + 1


def test_compiler_refuses_a_tiling_mirror_out_of_step():
    with pytest.raises(CompileError) as info:
        compile_kernel(_MisTiled(1024), "sm_90")
    assert "cek/kernel.py and CekTiling disagree on CHUNKS" in info.value.log


@pytest.mark.parametrize("dtype, packed", [("bf16", "cvt.rn.bf16x2.f32"),
                                           ("f16", "cvt.rn.f16x2.f32")])
@pytest.mark.parametrize("name", ["fused", "backward", "backward-rows"])
def test_16_bit_gradients_round_two_values_an_instruction(name, dtype, packed):
    assert packed in compile_kernel(kernel_classes()[name].for_n_dim(128, dtype), "sm_80").ptx


def _launch_bounds():
    """Each distinct `__launch_bounds__(threads, blocks)` of an entry point: the kernel, dtype
    and BLOCK_SIZE of the first instance that has it, and the text."""
    found = {}
    for cls in [*kernel_classes().values(), CosineEmbeddingLossReduce]:
        for dtype in DTYPES:
            for b in cls.block_sizes():
                k = cls(b, dtype)
                found.setdefault(f"{k.max_threads}, {k._min_blocks_expression()}", k.id)
    return found


def test_no_arch_warns_about_an_entry_points_launch_bounds():
    # ptxas ignores a blocks-an-SM hint beyond what the arch's SM holds (sm_75: 16 blocks and
    # 1024 threads; sm_86: 16 and 1536; sm_89, sm_120: 24 and 1536), with a warning on every
    # compile. The hint alone decides it: a one-line kernel carries each entry point's bounds.
    nvrtc = _nvrtc()
    warned = []
    for bounds, kernel_id in _launch_bounds().items():
        source = (f'extern "C" __global__ void __launch_bounds__({bounds}) '
                  f"probe(float* x) {{ x[threadIdx.x] *= 2.0f; }}\n")
        for arch in known_archs():
            log = nvrtc.compile(source, "probe.cu", list(nvrtc_options(arch)))
            log = log if isinstance(log, str) else log[0]
            if "warning" in log:
                warned.append(f"{kernel_id} on {arch}: {log.strip()}")
    assert warned == []


@pytest.mark.parametrize("name", [*kernel_classes()])
def test_every_arch_compiles_each_kernel_without_a_warning(name):
    # One width a kernel, in bfloat16 (its conversions are the most code), on every arch this
    # NVRTC knows: the log holds ptxas's warnings and the front end's.
    cls = kernel_classes()[name]
    kernel = cls.for_n_dim(min(cls.max_block_size, 1000), "bf16")
    logs = {arch: compile_kernel(kernel, arch).log for arch in known_archs()}
    assert {arch: log for arch, log in logs.items() if "warning" in log} == {}
