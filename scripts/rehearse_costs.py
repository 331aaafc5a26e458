"""What a cold start costs on the GPU machine's CPU, measured here for scripts/rehearse.py's
model, each figure in CPU seconds (cpu_seconds) and kept in the rehearsal's record folder, so
that each is measured once a rehearsal: one NVRTC compile of a cek kernel, one of CuPy's own
kernels of each kind, a cold torch.compile, a worker's start, and the float64 references of
the gpu tier's longest file.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = 4  # kernels compiled here to time NVRTC


def cpu_seconds() -> float:
    """The CPU seconds this process and the children it waited for have used, its start-up and
    imports included: what their work takes where its cores are its own, as on the GPU machine.
    The wall clock here also counts the wait for a core, several times the work itself on a
    busy 2-core machine. (Work spread over threads counts each thread's seconds: more, never
    less, than it takes there.)"""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def nvrtc_seconds(record: Path, kernels: list | None = None) -> float:
    """The seconds of one NVRTC compile here: as measured before, else measured now on SAMPLE
    of `kernels` (default: the fused kernel), after one compile that starts NVRTC."""
    if kernels is None and (record / "nvrtc_s").exists():
        return float((record / "nvrtc_s").read_text())
    from cek.compile import compile_kernel
    from cek.kernel import kernel_classes

    kernels = kernels or [kernel_classes()["fused"].for_n_dim(768)]
    compile_kernel(kernels[0], "sm_90")
    start = cpu_seconds()
    sample = kernels[::max(1, len(kernels) // SAMPLE)][:SAMPLE]
    for kernel in sample:
        compile_kernel(kernel, "sm_90")
    seconds = (cpu_seconds() - start) / len(sample)
    record.mkdir(parents=True, exist_ok=True)
    (record / "nvrtc_s").write_text(f"{seconds:.4f}")
    return seconds


# One of CuPy's elementwise kernels (a product of two float32 arrays) and one of its reductions
# along an axis (a CUB block reduction), as CuPy writes them: its headers are most of the time.
# Compiled in a Python of their own (the stand-in may be in CuPy's place in this one) with
# CuPy's NVRTC, its headers, the CCCL it ships and the CUDA headers of the nvidia wheels beside
# it, after a compile that starts NVRTC; it prints the seconds of each.
CUPY_COMPILES = r'''
import glob, pathlib, time
import cupy
from cupy.cuda import nvrtc
include = pathlib.Path(cupy.__file__).parent / "_core" / "include"
cccl = include / "cupy" / "_cccl"
folders = [include, cccl / "thrust", cccl / "libcudacxx", cccl / "cub",
           *glob.glob(str(pathlib.Path(cupy.__file__).parents[1] / "nvidia" / "*" / "include"))]
options = tuple(f"-I{folder}" for folder in folders) + ("-std=c++17", "-arch=sm_90")
ELEMENTWISE = """
#include <cupy/complex.cuh>
#include <cupy/carray.cuh>
extern "C" __global__ void cupy_multiply(CArray<float, 1, 1, 1> a, CArray<float, 1, 1, 1> b,
                                         CArray<float, 1, 1, 1> out, CIndexer<1> ind) {
  CUPY_FOR(i, ind.size()) { ind.set(i); out[ind.get()] = a[ind.get()] * b[ind.get()]; }
}
"""
REDUCTION = """
#include <cupy/complex.cuh>
#include <cupy/carray.cuh>
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void cupy_sum(const float* x, float* out, int n) {
  typedef cub::BlockReduce<float, 256> Reduce;
  __shared__ typename Reduce::TempStorage tmp;
  float v = 0;
  for (int i = threadIdx.x; i < n; i += 256) v += x[blockIdx.x * n + i];
  float s = Reduce(tmp).Sum(v);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}
"""
def seconds(source):
    start = time.process_time()
    nvrtc.compileProgram(nvrtc.createProgram(source, "cupy.cu", (), ()), options)
    return time.process_time() - start
seconds(ELEMENTWISE)
print(seconds(ELEMENTWISE), seconds(REDUCTION))
'''


def cupy_seconds(record: Path) -> tuple[float, float]:
    """(elementwise, reduction): the seconds here of one compile of each kind of CuPy's own
    kernels (CUPY_COMPILES), as measured before in this rehearsal, else now. Where they cannot
    be compiled here, cek's NVRTC seconds, said on stderr."""
    path = record / "cupy_s"
    if not path.exists():
        done = subprocess.run([sys.executable, "-c", CUPY_COMPILES], capture_output=True,
                              text=True, check=False)
        try:
            elementwise, reduction = map(float, done.stdout.split())
        except ValueError:
            print(f"rehearsal: CuPy's kernels do not compile here ({done.stderr.strip()[-300:]}); "
                  "modelled at cek's NVRTC seconds", file=sys.stderr)
            elementwise = reduction = nvrtc_seconds(record)
        record.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{elementwise:.4f} {reduction:.4f}")
    elementwise, reduction = map(float, path.read_text().split())
    return elementwise, reduction


# torch.compile's cold compile, measured: a training step of torch's own loss (forward and
# backward) compiled by inductor in a process of its own, with caches of its own.
TORCH_COMPILE = """
import torch
x1, x2 = (torch.randn(64, 32, requires_grad=True) for _ in range(2))
step = torch.compile(lambda a, b, y: torch.nn.functional.cosine_embedding_loss(a, b, y).backward())
step(x1, x2, torch.ones(64))
"""


def torch_compile_seconds(record: Path) -> float:
    """The seconds of one cold torch.compile here (TORCH_COMPILE: inductor builds C++ for this
    CPU, where the GPU machine builds Triton kernels), as measured before in this rehearsal,
    else now, less a torch import."""
    path = record / "torch_compile_s"
    if path.exists():
        return float(path.read_text())
    import tempfile

    with tempfile.TemporaryDirectory() as caches:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": caches, "TRITON_CACHE_DIR": caches}
        start = cpu_seconds()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, env=env)
        imported = cpu_seconds()
        subprocess.run([sys.executable, "-c", TORCH_COMPILE], check=True, env=env)
        seconds = cpu_seconds() - imported - (imported - start)
    record.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{seconds:.4f}")
    return seconds


def worker_start(imports: str) -> float:
    """The CPU seconds here of a worker's start: a Python that imports `imports`."""
    start = cpu_seconds()
    subprocess.run([sys.executable, "-c", f"import {imports}"], check=False,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return cpu_seconds() - start


REFERENCES = """
import sys, time
sys.path.insert(0, "tests")
from cek import check
import test_cosine_embedding_loss as t
start = time.process_time()
for cls in t.KERNELS:
    for n_dim in t.GPU_DIMS + [16384]:
        for seed, margin in enumerate(t.MARGINS):
            for n_rows in (1, 7, 300):
                check.expected(cls.for_n_dim(n_dim), t._inputs(cls, n_rows, n_dim, seed), margin)
print(time.process_time() - start)
"""


def gpu_tier_references(record: Path) -> float:
    """The seconds here of the float64 references test_gpu_matches_reference compares the GPU
    with (REFERENCES: its cases, their references alone), the gpu tier's longest CPU work; as
    measured before in this rehearsal, else now."""
    path = record / "references_s"
    if not path.exists():
        done = subprocess.run([sys.executable, "-c", REFERENCES], cwd=ROOT, capture_output=True,
                              text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        record.mkdir(parents=True, exist_ok=True)
        path.write_text(done.stdout.split()[-1])
    return float(path.read_text())
