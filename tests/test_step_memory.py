"""The bytes a training step allocates, cek's and torch's, eager and compiled: docs/torch.md's
table ("Memory per step"), held to what the steps allocate here.

A step is `loss_fn(x1, x2, y).backward()` on N x D inputs that require grad, the mean, labels
of +-1 in float32, the gradients of the step before released. Every allocation torch's
allocator makes during it is read from torch's own profiler (torch.profiler with
profile_memory=True) on CPU tensors: the bytes allocated in all, and the most held at once
above what was held before the step (the peak the bench reports on a GPU, where
torch.cuda.max_memory_allocated gives it). torch's steps run torch's own CPU code (eager, and
inductor's for torch.compile). cek's run its CUDA route on CPU tensors that answer is_cuda,
through the CuPy stand-in (tests/fake_cupy.py): every buffer of that route is torch's (the
kernels write into them through DLPack), so the profiler sees what a GPU's allocator would.
Each figure is a·N·D·s + b·N + c bytes, s the inputs' item size; three shapes give a, b and c,
and a fourth checks them.
"""

import re
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch._C._profiler import _EventType  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import cek.torch as ct  # noqa: E402
from test_gpu_glue import standin  # noqa: E402, F401
from test_torch_cuda_glue import CudaLike, cuda  # noqa: E402, F401

DOC = Path(__file__).resolve().parents[1] / "docs" / "torch.md"
SHAPES = [(64, 96), (128, 96), (64, 192)]  # N x D: a, b and c from these three ...
CHECK = (96, 160)  # ... and checked at a fourth
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# docs/torch.md's table: (route, dtype) -> (allocated in all, peak above the start), each
# (N·D coefficient in units of the item size s, bytes a row). The constant is at most CONSTANT.
CLAIMS = {
    ("torch eager", "float32"): ((9, 115), (4, 4)),
    ("torch eager", "bfloat16"): ((9, 63), (4, 2)),
    ("torch compiled", "float32"): ((2, 22), (2, 22)),
    ("torch compiled", "bfloat16"): ((2, 12), (2, 12)),
    ("cek eager", "float32"): ((2, 8), (2, 8)),
    ("cek eager", "bfloat16"): ((2, 8), (2, 8)),
    ("cek compiled", "float32"): ((2, 8), (2, 4)),
    ("cek compiled", "bfloat16"): ((2, 8), (2, 4)),
}
CONSTANT = 256


def allocations(step) -> tuple[int, int]:
    """(bytes allocated in all, the most held at once above the start) by torch's allocator
    during step(), from torch.profiler's allocation events in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation:
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
    total = held = peak = 0
    for _, size in sorted(events):  # a free is a negative size
        total += max(size, 0)
        held += size
        peak = max(peak, held)
    return total, peak


def _inputs(n, d, dtype, tensor_type=torch.Tensor):
    gen = torch.Generator().manual_seed(n * d)
    x1, x2 = (torch.randn(n, d, generator=gen).to(dtype).as_subclass(tensor_type)
              .requires_grad_() for _ in range(2))
    y = torch.tensor([1.0, -1.0] * (n // 2)).as_subclass(tensor_type)
    return x1, x2, y


def measured(loss_fn, n, d, dtype, tensor_type=torch.Tensor) -> tuple[int, int]:
    """allocations() of the second of two steps (the first builds what a loop builds once:
    compiled code, kernels' signatures), the first's gradients released."""
    x1, x2, y = _inputs(n, d, dtype, tensor_type)

    def step():
        x1.grad = x2.grad = None
        loss_fn(x1, x2, y).backward()

    step()
    x1.grad = x2.grad = None
    return allocations(step)


def fit(measure, dtype) -> list[tuple[int, int, int]]:
    """(a, b, c) of the allocated bytes and of the peak, from SHAPES, checked at CHECK."""
    size = torch.empty((), dtype=dtype).element_size()
    (t0, p0), (t1, p1), (t2, p2) = (measure(n, d) for n, d in SHAPES)
    (n0, d0), (n1, _), (_, d2) = SHAPES
    figures = []
    for f0, f1, f2 in ((t0, t1, t2), (p0, p1, p2)):
        a = (f2 - f0) / (n0 * (d2 - d0) * size)
        b = (f1 - f0 - a * (n1 - n0) * d0 * size) / (n1 - n0)
        c = f0 - a * n0 * d0 * size - b * n0
        assert a == int(a) and b == int(b), (f0, f1, f2, a, b)
        figures.append((int(a), int(b), int(c)))
    n, d = CHECK
    assert measure(n, d) == tuple(a * n * d * size + b * n + c for a, b, c in figures)
    return figures


def _check(route, dtype_name, figures):
    want = CLAIMS[route, dtype_name]
    assert [(a, b) for a, b, _ in figures] == [tuple(w) for w in want], figures
    assert all(0 <= c <= CONSTANT for _, _, c in figures), figures


@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_torch_eager(dtype_name):
    dtype = DTYPES[dtype_name]
    _check("torch eager", dtype_name,
           fit(lambda n, d: measured(F.cosine_embedding_loss, n, d, dtype), dtype))


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++: inductor cannot build CPU code")
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_torch_compiled(dtype_name):
    dtype = DTYPES[dtype_name]
    torch._dynamo.reset()
    compiled = torch.compile(F.cosine_embedding_loss, dynamic=True)
    _check("torch compiled", dtype_name,
           fit(lambda n, d: measured(compiled, n, d, dtype), dtype))


@pytest.mark.emulator
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_cek_eager(cuda, monkeypatch, dtype_name):  # noqa: F811
    dtype = DTYPES[dtype_name]
    monkeypatch.setattr(ct, "_plain_eager", lambda *tensors: True)  # the eager route's kernels
    _check("cek eager", dtype_name, fit(lambda n, d: _cek(cuda, ct.cosine_embedding_loss, n, d,
                                                           dtype), dtype))


@pytest.mark.emulator
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_cek_compiled(cuda, dtype_name):  # noqa: F811
    """The custom ops as a compiled graph runs them (dynamo's eager backend: AOTAutograd does
    not take the subclass that answers is_cuda into a custom op)."""
    dtype = DTYPES[dtype_name]
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, t: ct.cosine_embedding_loss(a, b, t, 0.0),
                             fullgraph=True, backend="eager", dynamic=True)
    _check("cek compiled", dtype_name, fit(lambda n, d: _cek(cuda, compiled, n, d, dtype),
                                           dtype))


class _Forget(list):
    """The stand-in's record of launches, keeping none: a launch's arrays are views of torch's
    buffers, and kept they would keep those buffers from being freed."""

    def append(self, launch):
        pass


def _cek(cuda, loss_fn, n, d, dtype):  # noqa: F811
    cuda.launches = _Forget()
    return measured(loss_fn, n, d, dtype, CudaLike)


def test_the_doc_states_these_figures():
    text = " ".join(DOC.read_text().split())
    table = text[text.index("## Memory per step"):]
    for (route, dtype_name), want in CLAIMS.items():
        cells = [_formula(a, b, dtype_name) for a, b in want]
        assert re.search(rf"\| {route} \| {dtype_name} \| {re.escape(cells[0])} \| "
                         rf"{re.escape(cells[1])} \|", table), (route, dtype_name, cells)


def _formula(a, b, dtype_name):
    """a·N·D·s + b·N written as the doc's table writes it, s the item size."""
    size = DTYPES[dtype_name].itemsize
    return f"{a * size}·N·D + {b}·N"
