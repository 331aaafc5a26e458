"""cek.torch compiles wherever torch's own cosine_embedding_loss compiles: any batch size with no
graph per size, mark_dynamic on the batch and the feature dimension, torch.export with a Dim on
the batch, and a margin that changes between calls, whatever its type.

Each case runs cek's loss and torch's loss the same way in one test, and compares the values
and the gradients (against torch's loss on float64 copies of the inputs, at each dtype's
tolerance) and the number of graphs dynamo compiled (counters["stats"]["unique_graphs"],
dynamo reset before each run): cek compiles no more than torch. CPU tensors compile with the
aot_eager backend (inductor for one dynamic step); tensors that claim CUDA take cek's CUDA
route, whose Python traces differently (the launch plan, the eager fused kernel's test),
through the CuPy stand-in (tests/fake_cupy.py) on dynamo's eager backend, the one backend that
takes their tensor subclass (tests/test_torch_cuda_glue.py).

`python tests/test_torch_compile_parity.py` prints the table of graph counts in docs/torch.md
("Compiling"), and test_the_docs_table_is_the_measured_one compares the two.
"""

import functools
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402
from oracle import TORCH_TOLERANCES, TORCH_TWICE_ROUNDED  # noqa: E402
from test_gpu_glue import standin  # noqa: E402,F401  (the fixture `cuda` needs it)
from test_torch_cuda_glue import CudaLike, cuda  # noqa: E402,F401
from torch._dynamo.utils import counters  # noqa: E402

F = torch.nn.functional
DOCS = Path(__file__).resolve().parents[1] / "docs" / "torch.md"
# (rtol, atol) of cek against torch's loss on float64 copies, for losses and gradients alike.
# bfloat16: float32 accumulation and one rounding, and a gradient for an upstream gradient
# other than 1 (the weights below) may be rounded twice (tests/oracle.py).
TOLERANCES = {torch.float32: TORCH_TOLERANCES["float32"],
              torch.bfloat16: TORCH_TWICE_ROUNDED["bfloat16"]}
LOSSES = {"cek": (ct.cosine_embedding_loss, ct.CosineEmbeddingLoss),
          "torch": (F.cosine_embedding_loss, torch.nn.CosineEmbeddingLoss)}
MARGINS = {"float": float, "np.float64": np.float64, "0-d tensor": torch.tensor}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.emulator)]
BACKENDS = {"cpu": "aot_eager", "cuda": "eager"}
LABELS = (1.0, -1.0, 1.0, 0.0, -1.0)  # 0: no loss, no gradient


class Case(NamedTuple):
    """One compiled function called once per (n, d, margin) of `calls`."""
    calls: tuple
    device: str = "cpu"
    dynamic: bool | None = None
    mark: int | None = None  # the dimension torch._dynamo.mark_dynamic marks on every call
    fullgraph: bool = True
    how: str = "argument"  # the margin as the function's argument, or a module's attribute
    margin: str = "float"  # its type: MARGINS
    dtype: torch.dtype = torch.float32
    reduction: str = "mean"
    grad: bool = True
    backend: str | None = None  # BACKENDS[device] by default


def _sizes(sizes, d=8, margin=0.1):
    return tuple((n, d, margin) for n in sizes)


BATCHES = _sizes(range(3, 15))  # 12 batch sizes
WIDTHS = tuple((6, d, 0.1) for d in range(3, 15))  # 12 widths
THREE_MARGINS = tuple((5, 8, margin) for margin in (0.1, 0.2, 0.3))

# The cases of the docs' table: (its row, the case less its device).
TABLE = [
    ("12 batch sizes, default `dynamic`", Case(BATCHES)),
    ("12 batch sizes, `dynamic=True`", Case(BATCHES, dynamic=True)),
    ("12 batch sizes, `mark_dynamic` on the batch dimension", Case(BATCHES, mark=0)),
    ("12 widths, `mark_dynamic` on the feature dimension", Case(WIDTHS, mark=1)),
    ("3 margins, a Python float argument", Case(THREE_MARGINS)),
    ("3 margins, a Python float argument, `dynamic=True`", Case(THREE_MARGINS, dynamic=True)),
    ("3 margins, a module attribute", Case(THREE_MARGINS, how="attribute")),
    ("3 margins, `np.float64`", Case(THREE_MARGINS, margin="np.float64")),
    ("3 margins, 0-d tensors (`fullgraph=False`)",
     Case(THREE_MARGINS, margin="0-d tensor", fullgraph=False)),
]


def _inputs(n, d, seed):
    """float64 rows whose cosines are mostly above the margins, so that rows of label -1 have
    a loss and a gradient, and float32 labels."""
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    x2 = x1 + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)
    return x1, x2, torch.tensor([LABELS[i % len(LABELS)] for i in range(n)])


def _weights(loss):
    """An upstream gradient other than 1."""
    return torch.linspace(0.5, 2.0, loss.numel(), dtype=loss.dtype).reshape(loss.shape)


def _plain(tensor):
    return None if tensor is None else tensor.detach().as_subclass(torch.Tensor)


def _run(which, case):
    """[(loss, dx1, dx2, weights) per call], and the graphs dynamo compiled, of `which` loss
    (LOSSES) in one function compiled as `case` says."""
    torch._dynamo.reset()
    counters.clear()
    function, module_class = LOSSES[which]
    module = module_class(reduction=case.reduction)
    if case.how == "attribute":
        def step(a, b, t, m):
            return module(a, b, t)
    else:
        def step(a, b, t, m):
            return function(a, b, t, m, reduction=case.reduction)
    compiled = torch.compile(step, backend=case.backend or BACKENDS[case.device],
                             fullgraph=case.fullgraph, dynamic=case.dynamic)
    results = []
    for seed, (n, d, margin) in enumerate(case.calls):
        x1, x2, target = _inputs(n, d, seed)
        tensors = [x.to(case.dtype) for x in (x1, x2)] + [target]
        if case.device == "cuda":
            tensors = [t.as_subclass(CudaLike) for t in tensors]
        a, b, t = tensors
        if case.grad:
            a, b = a.requires_grad_(), b.requires_grad_()
        if case.mark is not None:
            for x in (a, b, t)[:3 if case.mark == 0 else 2]:
                torch._dynamo.mark_dynamic(x, case.mark)
        margin = MARGINS[case.margin](margin)
        if case.how == "attribute":
            module.margin = margin
        with torch.set_grad_enabled(case.grad):
            loss = compiled(a, b, t, margin)
        weights = _weights(loss)
        if case.grad:
            (loss * weights).sum().backward()
        results.append((_plain(loss), _plain(a.grad), _plain(b.grad), _plain(weights)))
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    return results, graphs


@functools.lru_cache(maxsize=None)
def _both(case):
    """cek's and torch's runs of `case`: {"cek": _run, "torch": _run}. Cached: the docs' table
    reads the runs its rows share with the tests."""
    return {which: _run(which, case) for which in LOSSES}


def _check(case):
    """cek's values and gradients are torch's (on float64 copies), and cek compiled no more
    graphs than torch's loss did. (cek's graphs, torch's)."""
    runs = _both(case)
    (ours, our_graphs), (theirs, their_graphs) = runs["cek"], runs["torch"]
    rtol, atol = TOLERANCES[case.dtype]
    for seed, ((n, d, margin), got, same) in enumerate(zip(case.calls, ours, theirs)):
        x1, x2, target = _inputs(n, d, seed)
        a, b = (x.to(case.dtype).double().requires_grad_() for x in (x1, x2))
        want = F.cosine_embedding_loss(a, b, target, margin, reduction=case.reduction)
        if case.grad:
            (want * got[3].double()).sum().backward()
        assert got[0].dtype == same[0].dtype == case.dtype and got[0].shape == want.shape
        for ours_, wants in zip(got[:3], (want, a.grad, b.grad)):
            if case.grad or wants is want:
                torch.testing.assert_close(ours_.double(), wants.detach(), rtol=rtol,
                                           atol=atol, msg=lambda m: f"call {seed}: {m}")
            else:
                assert ours_ is None
    assert our_graphs <= their_graphs, (f"cek compiled {our_graphs} graphs, torch's loss "
                                        f"{their_graphs}")
    return our_graphs, their_graphs


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cuda":
        request.getfixturevalue("cuda")
    return request.param


@pytest.mark.parametrize("row, case", TABLE, ids=[row for row, _ in TABLE])
def test_the_docs_cases(device, row, case):
    """Batch sizes (default dynamic, dynamic=True, mark_dynamic on the batch and on the
    feature dimension) and margins that change (argument, module attribute, float,
    np.float64, 0-d tensor), fullgraph=True where torch's loss takes it: the code dynamo
    traces in cek.torch hashed a symbolic N (a set of the row counts), ran math.isfinite on
    a symbolic margin before it knew it was compiling, printed a traced NumPy margin in an
    error and read a fake tensor margin's value."""
    _check(case._replace(device=device))


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no grad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_reductions_dtypes_and_grads(device, reduction, dtype, grad):
    """One graph of dynamic=True over three batch sizes, as torch's, for every reduction,
    float32 and bfloat16, a step with gradients and one without."""
    assert _check(Case(_sizes((3, 7, 12)), device=device, dynamic=True, dtype=dtype,
                       reduction=reduction, grad=grad)) == (1, 1)


@pytest.mark.parametrize("how", ["argument", "attribute"])
def test_margins_under_dynamic_true(device, how):
    """The margin of a step with gradients under dynamic=True, as an argument and as a module
    attribute: on the CUDA route its first call raised Unsupported (math.isfinite on a
    symbolic float)."""
    _check(Case(THREE_MARGINS, device=device, dynamic=True, how=how))


def test_inductor_dynamic_batch():
    """Inductor's code for cek's ops on a symbolic batch (the fake results' shapes, the
    backward op's outputs): one graph after the first, as torch's."""
    _check(Case(_sizes((3, 4, 5, 6)), backend="inductor", reduction="none"))


@pytest.mark.emulator
def test_rows_no_kernel_takes_are_refused_when_the_compiled_step_runs(cuda):
    """The check of N and D against the kernels runs inside the ops, where sizes are numbers:
    a compiled step on rows wider than the split takes raises cek's ValueError, naming D,
    before any launch, as the eager call does."""
    from cek import cosine_embedding_loss_split as split

    d = split.max_n_dim("f32") + 1
    x = torch.ones(2, d).as_subclass(CudaLike)
    step = torch.compile(lambda a, b, t: ct.cosine_embedding_loss(a, b, t, 0.1),
                         backend="eager", fullgraph=True, dynamic=True)
    with pytest.raises(ValueError, match=str(d)):
        step(x, x, torch.ones(2).as_subclass(CudaLike))
    assert cuda.launches == []
    torch._dynamo.reset()


class _Loss(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, a, b, t):
        return self.function(a, b, t, 0.1, reduction="none")


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export_with_a_dynamic_batch(strict):
    """torch.export with a Dim on the batch: cek's op stays one node, and the program run at
    three sizes gives torch's values. (Non-strict raised TypeError: unhashable SymInt;
    strict, constraints violated.)"""
    n = torch.export.Dim("n")
    shapes = {"a": {0: n}, "b": {0: n}, "t": {0: n}}
    x1, x2, target = _inputs(5, 8, seed=0)
    programs = {which: torch.export.export(_Loss(LOSSES[which][0]), (x1.float(), x2.float(),
                                                                     target),
                                           dynamic_shapes=shapes, strict=strict)
                for which in LOSSES}
    assert "cek.cosine_embedding_loss" in str(programs["cek"].graph)
    for seed, rows in enumerate((2, 9, 33)):
        x1, x2, target = _inputs(rows, 8, seed)
        got = programs["cek"].module()(x1.float(), x2.float(), target)
        want = programs["torch"].module()(x1.float(), x2.float(), target)
        assert got.shape == want.shape == (rows,)
        torch.testing.assert_close(got, want, rtol=TOLERANCES[torch.float32][0],
                                   atol=TOLERANCES[torch.float32][1])


class _TensorMargin(torch.nn.Module):
    """The loss with its margin a 0-d tensor attribute (a margin schedule's state)."""

    def __init__(self, function):
        super().__init__()
        self.function, self.margin = function, torch.tensor(0.2)

    def forward(self, a, b, t):
        return self.function(a, b, t, self.margin)


def test_non_strict_export_of_a_tensor_margin():
    """A tensor margin under non-strict torch.export (its default): the program gives torch's
    value. (cek's call of its uncompiled path found itself still "compiling" there and handed
    the call back to that path: RecursionError.)"""
    x1, x2, target = _inputs(5, 8, seed=0)
    x1, x2 = x1.float(), x2.float()
    got, want = (torch.export.export(_TensorMargin(LOSSES[which][0]), (x1, x2, target),
                                     strict=False).module()(x1, x2, target)
                 for which in ("cek", "torch"))
    torch.testing.assert_close(got, want, rtol=TOLERANCES[torch.float32][0],
                               atol=TOLERANCES[torch.float32][1])


# -- the docs' table --------------------------------------------------------------------------

HEADER = ("| compiled step (`fullgraph=True` unless said) | CPU tensors: torch | cek "
          "| the CUDA route: torch | cek |")


def table(devices=("cpu", "cuda")):
    """The table docs/torch.md shows, from the runs of TABLE's cases on `devices` (the others'
    columns left as "?")."""
    lines = [HEADER, "|---|---|---|---|---|"]
    for row, case in TABLE:
        cells = []
        for device in ("cpu", "cuda"):
            if device in devices:
                ours, theirs = _check(case._replace(device=device))
                cells += [str(theirs), str(ours)]
            else:
                cells += ["?", "?"]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return lines


def _docs_rows():
    text = DOCS.read_text()
    assert HEADER in text, f"docs/torch.md has no table of graph counts: {HEADER}"
    lines = text[text.index(HEADER):].splitlines()
    return lines[:2 + len(TABLE)]


@pytest.mark.parametrize("column", DEVICES)
def test_the_docs_table_is_the_measured_one(column, request):
    """Each count in docs/torch.md's table is the one these runs give (the cases' runs are
    shared with the tests above)."""
    if column == "cuda":
        request.getfixturevalue("cuda")
    first = 1 if column == "cpu" else 3  # the column of torch's count; cek's follows
    for got, want in zip(table((column,))[2:], _docs_rows()[2:]):
        got, want = got.split("|"), want.split("|")
        assert got[1] == want[1] and got[first + 1:first + 3] == want[first + 1:first + 3], \
            f"docs/torch.md: {'|'.join(want)}, measured: {'|'.join(got)}"


def main():
    """Print the table, on CPU tensors and on the CUDA route through the stand-in."""
    import fake_cupy
    from cek.torch import _cuda

    class _Stream:
        cuda_stream = 0xC0FFEE

    with pytest.MonkeyPatch.context() as patch:
        fake_cupy.install(patch)
        patch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
        patch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        patch.setattr(_cuda, "_plans", {})
        print("\n".join(table()))


if __name__ == "__main__":
    main()
