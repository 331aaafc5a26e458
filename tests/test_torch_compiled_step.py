"""A training step compiled by inductor (torch.compile(fullgraph=True), the default backend), read
in the code inductor generates for CPU tensors, where it calls the same custom ops as for CUDA
tensors (docs/torch.md, "Bytes per step"):

- A step with inputs that require grad runs cek's loss op once in the forward and cek's backward
  op once in the backward, and no other code over the N x D rows: 24 N D bytes in float32, the
  least a graph of functional ops allows. Keeping the fused kernel's gradients, as the eager
  step does (16 N D), would need a backward op that changes a saved tensor in place, and
  inductor copies such a tensor first (the last test here, which fails once a torch release
  stops doing so: the compiled step can then keep them).
- Compiled inference runs the loss op alone: no gradient is computed.

The gradients are those of cek's eager step, bit for bit, and torch's within the tolerances of
tests/oracle.py. Rows of D = 67 among N = 40: a kernel over the rows' elements loops to D or to
N * D, numbers that no loop over the rows or the labels has.
"""

import re
import shutil

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

import cek.torch as ct  # noqa: E402
from oracle import TORCH_TOLERANCES  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("g++") is None,
                                reason="no g++ on PATH: inductor cannot build CPU kernels")

N, D = 40, 67
LOSS_OP = "torch.ops.cek.cosine_embedding_loss.default("
BACKWARD_OP = "torch.ops.cek.cosine_embedding_loss_backward.default("
# (dtype, reduction, weight of the loss in the step: 3 gives its backward an upstream of 3)
LOSSES = [(torch.float32, "mean", 1.0), (torch.float32, "sum", 3.0),
          (torch.bfloat16, "mean", 1.0), (torch.bfloat16, "sum", 1.0)]


def _inputs(requires_grad):
    gen = torch.Generator().manual_seed(11)
    pairs = []
    for dtype, _, _ in LOSSES:
        x1, x2 = (torch.randn(N, D, generator=gen).to(dtype).requires_grad_(requires_grad)
                  for _ in range(2))
        pairs.append((x1, x2))
    y = torch.tensor([1, -1, 1, -1, -1] * (N // 5))
    return pairs, y


def _step(loss_fn):
    def step(pairs, y):
        return sum(weight * loss_fn(x1, x2, y, 0.1, reduction=reduction).float()
                   for (x1, x2), (_, reduction, weight) in zip(pairs, LOSSES))
    return step


def _kernels(code):
    """The C++ sources of the kernels inductor generated in one graph's code."""
    return re.findall(r"cpp_pybinding\(\[[^\]]*\], r'''(.*?)'''", code, re.S)


def _over_the_rows(code):
    """The generated kernels that loop over the rows' elements (to D or N * D), and the
    allocations of N x D tensors."""
    bounds = re.compile(rf"\b({D}|{N * D})L\b")
    loops = [k for k in _kernels(code) if bounds.search(k)]
    return loops + re.findall(rf"empty_strided_cpu\(\({N}, {D}\)", code)


def _compiled(step, *args):
    """(result, forward code, backward code or None) of a fresh compile of `step`."""
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    holder = []
    backward = None

    def run():
        result = compiled(*args)
        holder.append(result)
        if result.requires_grad:
            result.backward()

    _, codes = run_and_get_code(run)
    forward = codes[0]
    if len(codes) > 1:
        backward = codes[1]
    assert len(codes) == (2 if holder[0].requires_grad else 1), len(codes)
    return holder[0], forward, backward


def test_compiled_step_runs_each_op_once_and_nothing_else_over_the_rows():
    pairs, y = _inputs(requires_grad=True)
    loss, forward, backward = _compiled(_step(ct.cosine_embedding_loss), pairs, y)
    assert forward.count(LOSS_OP) == len(LOSSES) and BACKWARD_OP not in forward, forward
    assert backward.count(BACKWARD_OP) == len(LOSSES) and LOSS_OP not in backward, backward
    assert _over_the_rows(forward) == [] and _over_the_rows(backward) == []

    eager_pairs, _ = _inputs(requires_grad=True)
    eager = _step(ct.cosine_embedding_loss)(eager_pairs, y)
    eager.backward()
    wide_pairs = [tuple(x.detach().double().requires_grad_() for x in pair) for pair in pairs]
    torchs = _step(F.cosine_embedding_loss)(wide_pairs, y.double())
    torchs.backward()
    assert torch.equal(loss, eager)
    for (x1, x2), (e1, e2), (w1, w2), (dtype, _, _) in zip(pairs, eager_pairs, wide_pairs,
                                                           LOSSES):
        assert torch.equal(x1.grad, e1.grad) and torch.equal(x2.grad, e2.grad)
        rtol, atol = TORCH_TOLERANCES[str(dtype).split(".")[1]]
        for got, want in ((x1.grad, w1.grad), (x2.grad, w2.grad)):
            assert got.dtype == dtype
            torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol)


def test_compiled_inference_computes_no_gradient():
    pairs, y = _inputs(requires_grad=False)
    loss, forward, backward = _compiled(_step(ct.cosine_embedding_loss), pairs, y)
    assert backward is None and not loss.requires_grad
    assert forward.count(LOSS_OP) == len(LOSSES) and BACKWARD_OP not in forward, forward
    assert _over_the_rows(forward) == []
    with torch.no_grad():
        pairs, y = _inputs(requires_grad=True)
        loss, forward, backward = _compiled(_step(ct.cosine_embedding_loss), pairs, y)
    assert backward is None and BACKWARD_OP not in forward and _over_the_rows(forward) == []


@torch.library.custom_op("cek_probe::fused", mutates_args=())
def _probe_fused(x1: torch.Tensor, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                               torch.Tensor]:
    return (x1 * x2).sum(), x2.clone(), x1.clone()


@_probe_fused.register_fake
def _(x1, x2):
    return x1.new_empty(()), torch.empty_like(x1), torch.empty_like(x2)


@torch.library.custom_op("cek_probe::keep", mutates_args=("dx1", "dx2"))
def _probe_keep(grad: torch.Tensor, dx1: torch.Tensor, dx2: torch.Tensor) -> None:
    dx1.mul_(grad)
    dx2.mul_(grad)


def _probe_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], output[2])
    ctx.mark_non_differentiable(output[1], output[2])


def _probe_backward(ctx, grad, _, __):
    dx1, dx2 = ctx.saved_tensors
    _probe_keep(grad, dx1, dx2)
    return dx1, dx2


_probe_fused.register_autograd(_probe_backward, setup_context=_probe_setup)


def test_inductor_copies_a_saved_tensor_that_a_backward_op_changes_in_place():
    """Why the compiled step does not keep the fused gradients: a forward op that returns the
    gradients for an upstream gradient of 1, saved, and a backward op that scales them in place
    (as the eager keep kernel does). Functionalization turns the change in place into a copy
    and inductor does not take it back: a saved tensor is a graph input of the backward, whose
    change is not copied back to anything. The copy lands in the saved tensor's own memory:
    a kernel that reads and writes every element of both, 16 N D bytes in float32 on top of the
    fused kernel's 16 N D, where the loss op and the backward op move 24 N D."""
    x1, x2 = (torch.randn(N, D, requires_grad=True) for _ in range(2))
    loss, _, backward = _compiled(lambda a, b: _probe_fused(a, b)[0], x1, x2)
    assert "torch.ops.cek_probe.keep.default(" in backward
    assert _over_the_rows(backward), (
        "inductor no longer copies a saved tensor a backward op changes in place: the "
        "compiled step can keep the fused kernel's gradients (docs/torch.md)\n" + backward)
    torch.testing.assert_close(x1.grad, x2.detach())
