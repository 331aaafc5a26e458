"""driver-only tier: a host with the NVIDIA driver and no CUDA toolkit, as a cloud VM or a
container has it, in a venv installed by one of the README's install lines.

`.ci/driver-only` runs this file in each venv of .ci/driver-only.txt (CEK_DRIVER_ONLY names the
line) inside a mount namespace where this machine's CUDA toolkit is hidden (.ci/without-toolkit);
elsewhere it skips with a reason. This machine has no driver either, so what needs one (a
module load, a launch) is the gpu tier's; everything before it is here: CuPy's NVRTC is of the
extra's CUDA major and its CUDA headers come from the venv, so CuPy's own compile path works,
for every kernel class and for CuPy's own elementwise kernels; `cek compile` works after the
install line; `cek doctor` names what is there, says that no driver is, and that what runs
without one works (exit 4).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_nvrtc import cupy_compile  # noqa: F401 - the fixture: CuPy's compile, no device

from cek import doctor
from cek.compile import nvrtc_options
from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
from cek.kernel import kernel_classes

LINE = os.environ.get("CEK_DRIVER_ONLY")
pytestmark = pytest.mark.skipif(
    LINE is None, reason="run by .ci/driver-only in a venv of .ci/driver-only.txt, on a host "
                         "whose CUDA toolkit it hides (it needs root for the mount namespace)")
# The CUDA major of the line's extra (cuda12, cuda13); None: the nvrtc extra, no CuPy.
MAJOR = int(re.match(r"cuda(\d+)", LINE)[1]) if LINE and LINE.startswith("cuda") else None
ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)


def _needs_cupy():
    if MAJOR is None:
        pytest.skip(f"{LINE}: a line without CuPy")
    return pytest.importorskip("cupy")


def _inside_the_venv(path) -> bool:
    return path is not None and VENV in Path(path).resolve().parents


def test_the_toolkit_is_hidden():
    assert shutil.which("nvcc") is None
    assert not {"CUDA_HOME", "CUDA_PATH"} & set(os.environ)
    assert not Path("/usr/local/cuda/include/cuda_runtime.h").exists()


def test_cupys_nvrtc_is_the_extras_cuda_major():
    cupy = _needs_cupy()
    assert cupy.cuda.nvrtc.getVersion()[0] == MAJOR
    assert _inside_the_venv(doctor.loaded_library("libnvrtc.so"))


def test_cupy_finds_its_cuda_headers_in_the_venv():
    cupy = _needs_cupy()
    facts = doctor.Facts()
    doctor._read_headers(facts, cupy)
    assert facts.headers_error is None and _inside_the_venv(facts.headers), facts
    assert facts.headers_cuda[0] == MAJOR


def _kernels() -> list[tuple[str, object]]:
    """Every kernel class, the reduction included, at D = 768 and 2^20 + 1 in float32, each
    kernel once: above 2^20 only the split's classes take a row, with the code they run at
    768 (one instance a dtype)."""
    widths: dict[str, list] = {}
    kernels = {}
    for name, cls in [*kernel_classes().items(), ("reduce", CosineEmbeddingLossReduce)]:
        for n_dim in (768, (1 << 20) + 1):
            try:
                kernel = cls.for_n_dim(n_dim, "f32")
            except ValueError:  # wider than one block takes: the split's twin takes it
                continue
            kernels[kernel.id] = kernel
            widths.setdefault(kernel.id, []).append(f"{name}@{n_dim}")
    return [("+".join(widths[key]), kernels[key]) for key in kernels]


KERNELS = _kernels()


def test_every_kernel_class_is_here_at_both_widths():
    names = {label.split("@")[0] for label, _ in KERNELS for label in label.split("+")}
    assert names == {*kernel_classes(), "reduce"}
    wide = {part.split("@")[0] for label, _ in KERNELS for part in label.split("+")
            if part.endswith(f"@{(1 << 20) + 1}")}
    assert {"split-sums", "fused-split", "forward-split", "backward-split"} <= wide


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("label, kernel", KERNELS, ids=[label for label, _ in KERNELS])
def test_cupys_compile_path_compiles_every_kernel(cupy_compile, label, kernel, arch):  # noqa: F811
    _needs_cupy()
    options, cubin = cupy_compile(kernel, arch)
    assert tuple(o for o in options if not o.startswith("-I")) == nvrtc_options(arch)
    assert cubin[:4] == b"\x7fELF"


def test_a_cupy_elementwise_kernel_compiles(cupy_compile):  # noqa: F811
    """CuPy's own kernels include CuPy's headers and, in float16, cuda_fp16.h of the CUDA
    headers: the compile CuPy 14 refuses without them. Written as CuPy writes an
    ElementwiseKernel (CArray, CIndexer, CUPY_FOR), compiled through the same path."""
    cupy = _needs_cupy()
    source = ("#include <cupy/float16.cuh>\n"
              'extern "C" __global__ void cek_twice(CArray<float16, 1, true, true> x, '
              "CIndexer<1> index) {\n"
              "  CUPY_FOR(i, index.size()) { index.set(i); "
              "x[index.get()] = x[index.get()] * float16(2.0f); }\n}\n")
    from cupy.cuda import compiler

    seen = []
    original = compiler._NVRTCProgram.compile

    def record(program, options=(), log_stream=None):
        out = original(program, options, log_stream)
        seen.append(tuple(options))
        return out

    compiler._NVRTCProgram.compile = record  # cupy_compile's monkeypatch restores it
    try:
        cupy._core.core.compile_with_cache(source, (), arch="90")
    except cupy.cuda.runtime.CUDARuntimeError:
        pass  # loading the module needs a driver; the compile is done by then
    assert seen, "CuPy compiled nothing"
    includes = [o[2:] for o in seen[-1] if o.startswith("-I")]
    assert any(_inside_the_venv(path) and "cupy" not in path for path in includes), includes


def _cek(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cek", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def test_cek_compile_works_after_the_install_line():
    proc = _cek("compile", "--kernel", "fused", "--n-dim", "768", "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"kernel_id": "cosine_embedding_loss_fused__f32__1024"' in proc.stdout


def test_cek_doctor_names_what_is_here_and_says_no_gpu():
    for args in ((), ("--json",)):
        proc = _cek("doctor", *args)
        # exit 4: no driver, and the CPU path, the emulator and cek compile run here
        assert proc.returncode == 4 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert "no NVIDIA driver (libcuda.so.1 is not installed)" in _cek("doctor").stdout
    facts = json.loads(proc.stdout)["facts"]
    assert facts["driver_cuda"] is None and facts["launches"] == []
    if MAJOR is None:
        assert facts["cupy_error"] == "not installed"
        assert re.fullmatch(r"13\.\d+ \(cuda-bindings'\)", facts["compile_nvrtc"])
    else:
        assert re.fullmatch(rf"14\.\d+\.\d+ \(cupy-cuda{MAJOR}x\)", facts["cupy"])
        assert facts["cupy_device_error"] == "no NVIDIA driver is installed"
        assert facts["nvrtc"][0] == MAJOR and _inside_the_venv(facts["nvrtc_file"])
        assert facts["headers_cuda"][0] == MAJOR and _inside_the_venv(facts["headers"])
        assert facts["compile_nvrtc"] == "{}.{} (CuPy's)".format(*facts["nvrtc"])
    if "torch" in LINE:
        assert (facts["torch"], facts["torch_cuda"]) == ("2.13.0+cpu", None)
    else:
        assert facts["torch_error"] == "not installed"
