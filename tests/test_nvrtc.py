"""compile tier: one compile, CuPy's, and every kernel on the NVRTC this environment has.

`cek compile` and its report must read the cubin a launch gets: CuPy's RawModule compiles with
the options it adds itself, and an NVRTC before 13.2 rejects the kernels without one of them.
The smoke below runs in the main environment and in CI's venv of every NVRTC of
.ci/nvrtc-matrix.txt (`.ci/nvrtc_smoke`), where the exact-count tests skip (tests/conftest.py).
"""

import pytest

from cek.compile import (LOADER_OPTIONS, OLDEST_TESTED_NVRTC, CompileError, compile_kernel,
                         nvrtc_options, nvrtc_version)
from cek.dtypes import DTYPES
from cek.kernel import kernel_classes

pytestmark = [pytest.mark.compile, pytest.mark.nvrtc_smoke]

# One width per code path: row groups (64), the register path (768), a tailed row (5600: 672
# threads, each holding one element past its chunks), the largest register row (8192) and a
# streamed row (30000).
SMOKE_WIDTHS = (64, 768, 5600, 8192, 30000)
SMOKE = [(name, dtype, n_dim) for name in kernel_classes() for dtype in DTYPES
         for n_dim in SMOKE_WIDTHS]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name, dtype, n_dim", SMOKE)
def test_every_kernel_compiles_without_spills(name, dtype, n_dim, arch):
    kernel = kernel_classes()[name].for_n_dim(n_dim, dtype)
    result = compile_kernel(kernel, arch)
    assert (result.spill_stores, result.spill_loads, result.local_bytes) == (0, 0, 0), result.log
    assert result.stack_bytes == 0, result.log


def test_options_are_cupys_in_cupys_order():
    assert nvrtc_options("sm_90") == (*LOADER_OPTIONS, "-ftz=true", "-arch=sm_90",
                                      "--device-as-default-execution-space")


def test_compile_error_names_the_nvrtc_version():
    kernel = kernel_classes()["forward"].for_n_dim(64, "f32")

    class Broken(type(kernel)):
        @property
        def kernel_source(self):
            return super().kernel_source + "\nthis is not C++;\n"

    with pytest.raises(CompileError) as info:
        compile_kernel(Broken(kernel.block_size, "f32"), "sm_90")
    major, minor = nvrtc_version()
    assert f"with NVRTC {major}.{minor} failed" in str(info.value)
    assert info.value.nvrtc == (major, minor)


def test_an_nvrtc_older_than_the_tested_ones_is_told_what_to_upgrade():
    older = (OLDEST_TESTED_NVRTC[0] - 1, 8)
    message = str(CompileError("k", "log", older))
    assert f"NVRTC {older[0]}.8 is older than the oldest cek is tested with" in message
    assert "pip install -U nvidia-cuda-nvrtc" in message
    assert "older than" not in str(CompileError("k", "log", OLDEST_TESTED_NVRTC))
    assert "NVRTC" not in str(CompileError("k", "log"))  # the emulator's g++


# -- CuPy's own compile, without a GPU ------------------------------------------------------

CUPY_CASES = [("fused", "f32", 768), ("backward", "bf16", 5600), ("forward-rows", "f16", 128),
              ("backward-keep", "f64", 30000)]


@pytest.fixture
def cupy_compile(monkeypatch):
    """Compile through cupy._core.core.compile_with_cache, the function RawModule(code=...)
    calls, for sm_90 without a device: the options and cubin NVRTC saw are recorded on their way
    out, and the module load that follows (which needs a driver) may fail."""
    cupy = pytest.importorskip("cupy")
    compiler = getattr(getattr(cupy, "cuda", None), "compiler", None)
    if getattr(compiler, "_NVRTCProgram", None) is None:
        pytest.skip("CuPy's compiler module is absent (the CuPy stand-in): nothing to compare")
    # The architecture's options are memoized per device, which asks the driver; the
    # undecorated function computes them from the architecture given.
    monkeypatch.setattr(compiler, "_get_arch_for_options_for_nvrtc",
                        compiler._get_arch_for_options_for_nvrtc.__wrapped__)
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")  # a disk cache hit would skip NVRTC
    seen = []
    original = compiler._NVRTCProgram.compile

    def record(program, options=(), log_stream=None):
        out = original(program, options, log_stream)
        seen.append((program.src, tuple(options), out[0]))
        return out

    monkeypatch.setattr(compiler._NVRTCProgram, "compile", record)

    def compile_like_raw_module(kernel):
        try:
            cupy._core.core.compile_with_cache(kernel.source, LOADER_OPTIONS, arch="90",
                                               prepend_cupy_headers=False)
        except cupy.cuda.runtime.CUDARuntimeError:
            pass  # loading the module needs a driver; the compile is done by then
        [(options, cubin)] = [(o, c) for src, o, c in seen if src == kernel.source]
        return options, _whole_elf(cubin)

    return compile_like_raw_module


def _whole_elf(image: bytes) -> bytes:
    """CuPy reads NVRTC's cubin as a C string, dropping its last byte (a NUL): the driver loads
    it all the same, nvdisasm wants the file whole. An ELF64 ends with its section or program
    header table, whichever comes last."""
    def field(at, size):
        return int.from_bytes(image[at:at + size], "little")

    end = max(field(0x28, 8) + field(0x3A, 2) * field(0x3C, 2),   # section headers
              field(0x20, 8) + field(0x36, 2) * field(0x38, 2))   # program headers
    assert image[:4] == b"\x7fELF" and 0 <= end - len(image) <= 1, (len(image), end)
    return image.ljust(end, b"\0")


@pytest.mark.parametrize("name, dtype, n_dim", CUPY_CASES)
def test_cek_compile_is_cupys_compile(cupy_compile, name, dtype, n_dim):
    from cek.sass import disassemble, find_nvdisasm

    kernel = kernel_classes()[name].for_n_dim(n_dim, dtype)
    options, cubin = cupy_compile(kernel)
    # CuPy's include directories are searched for nothing: cek's sources include only their
    # own headers, inlined by cek.sources.
    assert tuple(o for o in options if not o.startswith("-I")) == nvrtc_options("sm_90")
    if find_nvdisasm() is None:
        pytest.skip("nvdisasm not installed: options compared, SASS not")
    cupys = tuple(pytest.importorskip("cupy").cuda.nvrtc.getVersion())
    if cupys != nvrtc_version():  # CuPy for CUDA 12 beside cek's NVRTC 13: two compilers
        pytest.skip(f"CuPy compiles with NVRTC {cupys}, cek with {nvrtc_version()}: options "
                    "compared, SASS not")
    assert disassemble(cubin) == disassemble(compile_kernel(kernel, "sm_90").cubin)


def test_a_cupy_compile_error_names_cupys_nvrtc_and_its_wheel():
    from types import SimpleNamespace

    from cek import gpu

    def cupy_with(version):
        nvrtc = SimpleNamespace(getVersion=lambda: version)
        return SimpleNamespace(cuda=SimpleNamespace(nvrtc=nvrtc))

    version, upgrade = gpu._cupy_nvrtc(cupy_with((12, 4)))
    assert version == (12, 4) and "nvidia-cuda-nvrtc-cu12" in upgrade
    assert "nvidia-cuda-nvrtc " in gpu._cupy_nvrtc(cupy_with((13, 0)))[1]
    message = str(CompileError("k", "log", *gpu._cupy_nvrtc(cupy_with((11, 8)))))
    assert "with NVRTC 11.8 failed" in message and "(the NVRTC CuPy loads)" in message
    cupy = pytest.importorskip("cupy")
    if hasattr(cupy.cuda, "nvrtc"):  # the real CuPy reads its NVRTC without a device
        assert gpu._cupy_nvrtc(cupy)[0] == tuple(cupy.cuda.nvrtc.getVersion())
