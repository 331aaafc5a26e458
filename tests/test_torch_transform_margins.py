"""A NaN or infinite margin under torch.func.grad, vmap(grad), torch.func.jvp and forward-mode
AD, where cek.torch runs its composite formula (cek/torch/_composite.py), against torch's own
loss: label -1 rows with a NaN margin have a NaN loss and no gradient (torch's clamp_min passes
none where c - margin is NaN), +inf no loss and no gradient, -inf an infinite loss and the
gradient of c. cek's own loss.backward() gave these; the transforms let the gradient of c
through for a NaN margin (a comparison with NaN is False both ways)."""

import math

import pytest

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as fwAD  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cek.torch as ct  # noqa: E402

MARGINS = [math.nan, math.inf, -math.inf]
IDS = ["nan", "inf", "-inf"]
REDUCTIONS = ["none", "mean", "sum"]


def _inputs(seed=0, rows=6, dim=5):
    gen = torch.Generator().manual_seed(seed)
    x1, x2 = (torch.randn(rows, dim, generator=gen, dtype=torch.float64) for _ in range(2))
    y = torch.tensor([1.0, -1.0, -1.0, 1.0, 0.0, -1.0], dtype=torch.float64)[:rows]
    return x1, x2, y


def _same(ours, theirs):
    torch.testing.assert_close(ours, theirs, equal_nan=True, rtol=1e-12, atol=1e-12)


def _scalar(fn, y, margin, reduction):
    """The loss as a scalar function of (x1, x2), as torch.func.grad wants one."""
    def f(a, b):
        loss = fn(a, b, y, margin, reduction=reduction)
        return loss.sum() if reduction == "none" else loss
    return f


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", MARGINS, ids=IDS)
def test_func_grad(margin, reduction):
    x1, x2, y = _inputs()
    ours = torch.func.grad(_scalar(ct.cosine_embedding_loss, y, margin, reduction), (0, 1))(x1, x2)
    theirs = torch.func.grad(_scalar(F.cosine_embedding_loss, y, margin, reduction), (0, 1))(x1, x2)
    _same(ours, theirs)
    if math.isnan(margin):  # the reproducer of the report: a row of label -1 got c's gradient
        assert (ours[0][y == -1] == 0).all() and (ours[1][y == -1] == 0).all()


@pytest.mark.parametrize("margin", MARGINS, ids=IDS)
def test_vmap_of_grad(margin):
    """Per-row gradients: each row a 1-D problem with a 0-d label."""
    x1, x2, y = _inputs(seed=1)

    def per_row(fn):
        def f(a, b, label):
            return fn(a, b, label, margin)
        return torch.vmap(torch.func.grad(f, (0, 1)))(x1, x2, y)

    _same(per_row(ct.cosine_embedding_loss), per_row(F.cosine_embedding_loss))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", MARGINS, ids=IDS)
def test_func_jvp(margin, reduction):
    x1, x2, y = _inputs(seed=2)
    gen = torch.Generator().manual_seed(3)
    tangents = tuple(torch.randn(x1.shape, generator=gen, dtype=torch.float64) for _ in range(2))

    def run(fn):
        return torch.func.jvp(lambda a, b: fn(a, b, y, margin, reduction=reduction),
                              (x1, x2), tangents)

    loss, tangent = run(ct.cosine_embedding_loss)
    _same((loss, tangent), run(F.cosine_embedding_loss))
    if math.isnan(margin) and reduction == "none":
        assert (tangent[y == -1] == 0).all()


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", MARGINS, ids=IDS)
def test_forward_mode_dual_level(margin, reduction):
    x1, x2, y = _inputs(seed=4)
    gen = torch.Generator().manual_seed(5)
    t1, t2 = (torch.randn(x1.shape, generator=gen, dtype=torch.float64) for _ in range(2))

    def run(fn):
        with fwAD.dual_level():
            duals = fwAD.make_dual(x1, t1), fwAD.make_dual(x2, t2)
            primal, tangent = fwAD.unpack_dual(fn(*duals, y, margin, reduction=reduction))
        return primal, tangent

    _same(run(ct.cosine_embedding_loss), run(F.cosine_embedding_loss))


@pytest.mark.parametrize("margin", MARGINS, ids=IDS)
def test_transforms_agree_with_cek_backward(margin):
    """The transforms' gradient is the one cek's own loss.backward() gives (its kernels' route
    on CPU tensors, the composite gradient for a non-finite margin)."""
    x1, x2, y = _inputs(seed=6)
    a1, a2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    ct.cosine_embedding_loss(a1, a2, y, margin, reduction="sum").backward()
    ours = torch.func.grad(_scalar(ct.cosine_embedding_loss, y, margin, "sum"), (0, 1))(x1, x2)
    _same(ours, (a1.grad, a2.grad))


@pytest.mark.parametrize("margin", [0.1, math.nan], ids=["0.1", "nan"])
def test_nan_cosine_rows_under_the_transforms(margin):
    """Rows whose c is NaN (an inf or a NaN element) among ordinary ones: torch's loss, gradient
    and tangent, label -1 rows included (torch passes no tangent through a NaN c - margin)."""
    x1, x2, y = _inputs(seed=7)
    x1[1, 2], x2[2, 0], x1[5, 4] = math.inf, math.nan, -math.inf
    tangents = (torch.ones_like(x1), -torch.ones_like(x2))
    for reduction in REDUCTIONS:
        ours, theirs = (torch.func.jvp(lambda a, b: fn(a, b, y, margin, reduction=reduction),
                                       (x1, x2), tangents)
                        for fn in (ct.cosine_embedding_loss, F.cosine_embedding_loss))
        _same(ours, theirs)
        ours, theirs = (torch.func.grad(_scalar(fn, y, margin, reduction), (0, 1))(x1, x2)
                        for fn in (ct.cosine_embedding_loss, F.cosine_embedding_loss))
        _same(ours, theirs)
