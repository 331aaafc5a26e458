"""cek.torch as a drop-in for torch's loss on CPU tensors: custom ops under torch.compile,
opcheck, export and fake tensors; higher-order autograd, jvp and vmap; torch's promotion,
broadcasting and D = 0; EPS as torch adds it in float64."""

import numpy as np
import pytest

from cek import emulate, reference
from cek.cosine_embedding_loss_forward import CosineEmbeddingLossForward

torch = pytest.importorskip("torch")
import cek.torch as ct  # noqa: E402

F = torch.nn.functional
LABELS = torch.tensor([1.0, -1.0, 0.0, 2.0, 1.0, -1.0], dtype=torch.float64)


def _inputs(n=6, d=5, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    x2 = 0.5 * x1 + torch.randn(n, d, generator=g, dtype=torch.float64)
    return x1.to(dtype).requires_grad_(), x2.to(dtype).requires_grad_(), LABELS[:n].clone()


def _twins(*tensors):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


# -- custom ops --------------------------------------------------------------------------------


def test_opcheck_both_ops():
    x1, x2, y = _inputs()
    for reduction in ("none", "mean"):
        torch.library.opcheck(torch.ops.cek.cosine_embedding_loss.default,
                              (x1, x2, y, -0.2, reduction))
    grad = torch.tensor(1.5, dtype=torch.float64)
    torch.library.opcheck(torch.ops.cek.cosine_embedding_loss_backward.default,
                          (grad, x1, x2, y, -0.2, "sum"))


def test_opcheck_transposed_and_single_row_inputs():
    """The fake implementations give what the real ops give, new contiguous tensors whatever the
    inputs' strides, for (N, D) and (D,) inputs (planted: a backward fake of empty_like(x1)
    keeps a transposed x1's strides and fails opcheck's test_faketensor)."""
    x1, x2, y = (t.detach() for t in _inputs())
    transposed = x1.t().contiguous().t()
    assert transposed.stride() == (1, 6)
    for a1, a2, target in ((transposed, x2, y), (x1[0], x2[0], y[0]), (x1[1], x2[2].t(), y[1])):
        for reduction in ("none", "mean"):
            torch.library.opcheck(torch.ops.cek.cosine_embedding_loss.default,
                                  (a1, a2, target, -0.2, reduction))
        grad = torch.linspace(0.5, 2.0, a1.shape[0], dtype=torch.float64) if a1.dim() == 2 \
            else torch.tensor(1.5, dtype=torch.float64)
        torch.library.opcheck(torch.ops.cek.cosine_embedding_loss_backward.default,
                              (grad, a1, a2, target, -0.2, "none"))


def test_compile_transposed_and_single_row_inputs():
    """A compiled step on a transposed leaf and on a (D,) leaf of stride 2: inductor checks the
    backward op's outputs against the fake's sizes and strides (assert_size_stride), so a fake
    of other strides than the real op's fails here (planted: empty_like(x1) in the backward's
    fake). Without inductor's caches: a graph cached before a fake changed keeps the asserts
    of the old fake."""
    torch._dynamo.reset()
    x1, x2, y = (t.detach() for t in _inputs(seed=8))
    leaves = [x1.t().contiguous().t(), torch.stack((x1[0], x1[1]), 1)[:, 0]]
    assert leaves[0].stride() == (1, 6) and leaves[1].stride() == (2,)
    leaves = [t.requires_grad_() for t in leaves]
    twins = [t.detach().clone().requires_grad_() for t in leaves]

    def step(a, row, b, y):
        return ct.cosine_embedding_loss(a, b, y, 0.1), ct.cosine_embedding_loss(
            row, b[2], y[1], 0.1, reduction="sum")

    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        compiled = torch.compile(step, fullgraph=True)(*leaves, x2, y)
        eager = step(*twins, x2, y)
        torch.testing.assert_close(compiled, eager)
        sum(compiled).backward()
        sum(eager).backward()
    for got, want in zip(leaves, twins):
        torch.testing.assert_close(got.grad, want.grad)


def test_compile_fullgraph_matches_eager():
    """One compiled graph (AOTAutograd compiles its backward too), no graph break allowed."""
    torch._dynamo.reset()
    model = torch.nn.Linear(5, 5, dtype=torch.float64)
    loss_fn = ct.CosineEmbeddingLoss(margin=0.1)

    def step(a, b, y):
        return loss_fn(model(a), model(b), y)

    a, b, y = _inputs()
    a, b = a.detach(), b.detach()
    eager = step(a, b, y)
    eager.backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(step, fullgraph=True)(a, b, y)
    compiled.backward()
    torch.testing.assert_close(compiled, eager)
    for p, g in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, g)


def test_export_and_meta_tensors():
    class Model(torch.nn.Module):
        def forward(self, a, b, y):
            return ct.cosine_embedding_loss(a, b, y, reduction="none")

    x1, x2, y = (t.detach() for t in _inputs())
    program = torch.export.export(Model(), (x1, x2, y))
    assert "cek.cosine_embedding_loss" in str(program.graph)
    torch.testing.assert_close(program.module()(x1, x2, y), F.cosine_embedding_loss(
        x1, x2, y, reduction="none"))
    meta = ct.cosine_embedding_loss(x1.to("meta"), x2.to("meta").float(), y.to("meta"),
                                    reduction="none")
    assert meta.device.type == "meta" and meta.shape == (6,) and meta.dtype == torch.float64


def test_composite_path_on_meta_tensors(monkeypatch):
    """The composite torch formula (devices other than CPU and CUDA, D = 0, create_graph, the
    transforms) holds no CPU- or CUDA-only call: on meta tensors, a device of neither kind, it
    gives the loss's and the gradients' shapes, dtypes and device. The public function takes it
    on meta tensors of D = 0 (no other device but CPU and meta exists on a CPU-only torch)."""
    from cek.torch import _composite

    calls = []
    real = _composite.loss
    monkeypatch.setattr(_composite, "loss", lambda *args: calls.append(args) or real(*args))
    empty = torch.empty(4, 0, dtype=torch.float64, device="meta")
    y = torch.ones(4, device="meta")
    for reduction, shape in (("none", (4,)), ("mean", ()), ("sum", ())):
        out = ct.cosine_embedding_loss(empty, empty, y, 0.1, reduction=reduction)
        assert (out.device.type, out.shape, out.dtype) == ("meta", shape, torch.float64)
    assert len(calls) == 3
    a1, a2 = (torch.empty(4, 5, dtype=torch.float16, device="meta") for _ in range(2))
    loss = real(a1, a2, y, 0.1, "none")
    assert (loss.device.type, loss.shape, loss.dtype) == ("meta", (4,), torch.float16)
    for dx in _composite.gradients(torch.ones((), device="meta"), a1, a2, y, 0.1, "mean"):
        assert (dx.device.type, dx.shape, dx.dtype) == ("meta", (4, 5), torch.float16)


# -- higher order, forward mode, vmap ----------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_gradgradcheck(reduction):
    x1, x2, y = _inputs(seed=1)
    assert torch.autograd.gradgradcheck(
        lambda a, b: ct.cosine_embedding_loss(a, b, y, -0.5, reduction=reduction), (x1, x2))


def test_gradient_penalty_matches_torch():
    """The silently wrong case of before: create_graph gave a gradient with no graph."""
    results = []
    for loss_fn in (ct.cosine_embedding_loss, F.cosine_embedding_loss):
        x1, x2, y = _inputs(seed=2)
        loss = loss_fn(x1, x2, y, -0.5)
        (g,) = torch.autograd.grad(loss, x1, create_graph=True)
        assert g.requires_grad
        (loss + 10 * g.pow(2).sum()).backward()
        results.append((x1.grad, x2.grad))
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs)


def test_jvp_forward_ad_and_vmap_match_torch():
    x1, x2, y = (t.detach() for t in _inputs(seed=3))
    t1, t2 = torch.randn_like(x1), torch.randn_like(x2)
    for reduction in ("none", "mean"):
        def run(fn):
            return torch.func.jvp(lambda a, b: fn(a, b, y, 0.1, reduction=reduction),
                                  (x1, x2), (t1, t2))
        torch.testing.assert_close(run(ct.cosine_embedding_loss), run(F.cosine_embedding_loss))
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        dual = fwAD.make_dual(x1, t1)
        ours = fwAD.unpack_dual(ct.cosine_embedding_loss(dual, x2, y)).tangent
        theirs = fwAD.unpack_dual(F.cosine_embedding_loss(dual, x2, y)).tangent
    torch.testing.assert_close(ours, theirs)
    batched = [t.reshape(2, 3, *t.shape[1:]) for t in (x1, x2, y)]
    torch.testing.assert_close(torch.vmap(ct.cosine_embedding_loss)(*batched),
                               torch.vmap(F.cosine_embedding_loss)(*batched))


# -- torch's rules for inputs ------------------------------------------------------------------

PAIRS = [(torch.float32, torch.float64), (torch.float16, torch.float32),
         (torch.bfloat16, torch.float16), (torch.float64, torch.bfloat16)]


@pytest.mark.parametrize("dtype1, dtype2", PAIRS)
def test_mixed_dtypes_promote_as_torch(dtype1, dtype2):
    x1, x2, y = _inputs(seed=4)
    a1, a2 = x1.detach().to(dtype1).requires_grad_(), x2.detach().to(dtype2).requires_grad_()
    b1, b2 = _twins(a1, a2)
    ours = ct.cosine_embedding_loss(a1, a2, y)
    theirs = F.cosine_embedding_loss(b1.double(), b2.double(), y).to(ours.dtype)
    assert ours.dtype == F.cosine_embedding_loss(b1, b2, y).dtype
    tol = 1e-2 if torch.promote_types(dtype1, dtype2).itemsize == 2 else 1e-5
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)
    ours.backward()
    assert a1.grad.dtype == dtype1 and a2.grad.dtype == dtype2


@pytest.mark.parametrize("target", [torch.tensor([1, -1, 0, 1, 1, -1]),
                                    torch.tensor([True, False, True, True, False, True]),
                                    torch.tensor([1.0]), torch.tensor(1)],
                         ids=["int64", "bool", "(1,)", "0-d int"])
def test_targets_as_torch_takes_them(target):
    x1, x2, _ = _inputs(seed=5)
    if target.dim() == 0:
        x1, x2 = x1[0].detach().requires_grad_(), x2[0].detach().requires_grad_()
    b1, b2 = _twins(x1, x2)
    ours = ct.cosine_embedding_loss(x1, x2, target, 0.1, reduction="none")
    theirs = F.cosine_embedding_loss(b1, b2, target, 0.1, reduction="none")
    torch.testing.assert_close(ours, theirs)
    ours.sum().backward()
    theirs.sum().backward()
    torch.testing.assert_close(x1.grad, b1.grad)


def test_rows_broadcast_as_torch():
    x1, x2, y = _inputs(seed=6)
    one = x2[:1].detach().clone().requires_grad_()
    b1, b_one = _twins(x1, one)
    ours = ct.cosine_embedding_loss(x1, one, y, reduction="none")
    theirs = F.cosine_embedding_loss(b1, b_one, y, reduction="none")
    torch.testing.assert_close(ours, theirs)
    ours.sum().backward()
    theirs.sum().backward()
    assert one.grad.shape == (1, 5)
    torch.testing.assert_close(one.grad, b_one.grad)


@pytest.mark.parametrize("margin", [-0.5, 0.5])
def test_zero_width_as_torch(margin):
    x = torch.zeros(4, 0, dtype=torch.float64, requires_grad=True)
    y = LABELS[:4]
    for reduction in ("none", "mean"):
        torch.testing.assert_close(ct.cosine_embedding_loss(x, x, y, margin, reduction=reduction),
                                   F.cosine_embedding_loss(x, x, y, margin, reduction=reduction))
    ct.cosine_embedding_loss(x, x, y, margin).backward()
    assert x.grad.shape == (4, 0)


# -- EPS: torch's float 1e-12 widened to double ------------------------------------------------

# Rows where EPS decides the result at float64's 1e-9 level: a zero row (c = 0 against any x2),
# and rows of size ~1e-6, whose squared norm is ~1e-12, as large as EPS itself.
TINY = torch.tensor([[0.0, 0.0, 0.0], [1e-6, -2e-6, 5e-7], [3e-7, 1e-6, 0.0]],
                    dtype=torch.float64)
TINY2 = torch.tensor([[1.0, 2.0, 3.0], [2e-6, 1e-6, -1e-6], [-1e-6, 4e-7, 1e-6]],
                     dtype=torch.float64)
TINY_Y = torch.tensor([1.0, 1.0, -1.0])


def test_eps_float64_parity_with_torch():
    """torch adds float(1e-12) = 9.999999960041972e-13; adding exactly 1e-12 moves these rows
    by more than the 1e-15 asked here (planted: reference.EPS = 1e-12 fails this)."""
    want = F.cosine_embedding_loss(TINY, TINY2, TINY_Y, -1.0, reduction="none").numpy()
    numpy_path = ct.cosine_embedding_loss(TINY, TINY2, TINY_Y, -1.0, reduction="none").numpy()
    ref = reference.forward(TINY.numpy(), TINY2.numpy(), TINY_Y.numpy(), -1.0)
    np.testing.assert_allclose(numpy_path, want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(ref, want, rtol=0, atol=1e-15)
    assert not np.allclose(_with_exact_eps(), want, rtol=0, atol=1e-15)  # the test can fail


def _with_exact_eps():
    x1, x2 = TINY.numpy(), TINY2.numpy()
    c = np.einsum("ij,ij->i", x1, x2) / np.sqrt(
        (np.einsum("ij,ij->i", x1, x1) + 1e-12) * (np.einsum("ij,ij->i", x2, x2) + 1e-12))
    return np.where(TINY_Y.numpy() == 1, 1 - c, np.maximum(c + 1.0, 0))


@pytest.mark.emulator
def test_eps_float64_kernel_parity_with_torch():
    """The float64 forward kernel, run by the emulator on the same rows."""
    kernel = CosineEmbeddingLossForward.for_n_dim(3, "f64")
    out = np.full(3, np.nan)
    args = (TINY.numpy().copy(), TINY2.numpy().copy(), TINY_Y.double().numpy(), out, 3, 3, -1.0)
    cast = kernel.check_args(args, (np.ndarray,))
    grid, block, shared_mem = kernel.launch_config(*kernel.problem_size(cast))
    emulate.load(kernel)(grid, block, cast, shared_mem=shared_mem)
    want = F.cosine_embedding_loss(TINY, TINY2, TINY_Y, -1.0, reduction="none").numpy()
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-15)


def test_traced_backward_is_the_kernel_op():
    """What AOTAutograd traces for a step: cek's two ops, not the composite formula (which
    only create_graph, transforms and D = 0 take)."""
    from functorch.compile import aot_function, make_boxed_func

    graphs = {}

    def keep(name):
        def compiler(gm, inputs):
            graphs[name] = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
            return make_boxed_func(gm.forward)
        return compiler

    step = aot_function(lambda a, b, y: ct.cosine_embedding_loss(a, b, y),
                        fw_compiler=keep("forward"), bw_compiler=keep("backward"))
    x1, x2, y = _inputs(seed=7)
    step(x1, x2, y).backward()
    assert "cek.cosine_embedding_loss.default" in graphs["forward"]
    assert [t for t in graphs["backward"] if t.startswith(("cek.", "aten."))] == [
        "cek.cosine_embedding_loss_backward.default"]
