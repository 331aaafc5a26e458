"""cek.torch's composite route (cek/torch/_composite.py) on huge rows: the gradient with
create_graph=True, torch.vmap, torch.func.grad and jvp, a forward-mode AD dual level and a NaN or
infinite margin give the formula's values for rows up to the dtype's largest finite values,
next to ordinary rows in the same batch, as the kernels and the CPU path do (README: every
finite input gives the formula's values). Ordinary rows keep the very bits of the unscaled
formula, and D = 0 still gives torch's values.

The float64 reference (cek.reference) runs on copies of the rows: a float64 row above 2^200 is
brought down by a power of two to a largest magnitude near 2^200 (float64 squares that without
overflow, and EPS is as negligible there as for the row itself); every other row, float32 and
bfloat16 ones included, is its own copy. c and the loss do not change; a gradient scales as
1/x, so the results are compared scaled up by the same power.
"""

import math

import numpy as np
import pytest

from cek import reference

torch = pytest.importorskip("torch")
import torch.autograd.forward_ad as fwAD  # noqa: E402

import cek.torch as ct  # noqa: E402
from cek.torch import _composite  # noqa: E402
from oracle import TORCH_TOLERANCES  # noqa: E402

# {dtype: (rtol, atol)}: a loss passes where |got - want| <= rtol*|want| + atol; a gradient or a
# directional derivative where |got - want| <= rtol*|want| + atol*size + the dtype's subnormal
# step, size being the terms it is the difference of (reference.gradient_magnitudes), as
# oracle.GLUE_TOLERANCES judges gradients: an absolute atol would pass a gradient of 0 for the
# rows of 1e20, whose gradient is about 1e-21.
TOLERANCES = {getattr(torch, name): tol for name, tol in TORCH_TOLERANCES.items()}

MARGIN = -0.5  # label -1 rows with c > -0.5 have a loss and a gradient
LABELS = [1.0, -1.0] * 4
# Per row, the largest magnitude of x1 and x2 as a fraction of the case's top: huge on one side,
# both or neither (rows 4 and 7 are ordinary whatever the top).
SIDES1 = [1.0, 1.0, None, 1 / 3, None, 1.0, None, None]
SIDES2 = [None, 1.0, 1.0, 1 / 3, None, None, 1.0, None]
ORDINARY = [2.0, 0.75, 0.5, 1.5, 0.9, 1.25, 3.0, 0.6]  # the largest magnitude of other rows

# (dtype, top): a float32 squared norm overflows from |x| ~ 1e19 (1e20 and the largest value)
# and reaches sqrt(max), where rows are scaled, from norms of 4.3e9 (1e12: finite squares);
# float64 from ~1e154 (1e200, the largest value) and 1.2e77 (1e100); bfloat16 is computed in
# float32 (1e37 up to 3.39e38); float16 too, where its largest values square without overflow:
# there the route must equal the reference as it stands.
CASES = [(torch.float32, 1e12), (torch.float32, 1e20), (torch.float32, "max"),
         (torch.float64, 1e100), (torch.float64, 1e200), (torch.float64, "max"),
         (torch.bfloat16, 1e37), (torch.bfloat16, "max"), (torch.float16, "max")]
IDS = [f"{str(d).split('.')[1]}-{t}" for d, t in CASES]


def _top(dtype, top):
    return torch.finfo(dtype).max if top == "max" else top


def _side(draws, sides, top, dtype):
    """Rows of float64 draws scaled to the largest magnitudes `sides` (of top) or ORDINARY,
    rounded to dtype (to nearest, from at most top: at most top)."""
    scale = torch.tensor([top * s if s else o for s, o in zip(sides, ORDINARY)],
                         dtype=torch.float64)[:, None]
    x = (draws / draws.abs().amax(1, keepdim=True) * scale).to(dtype)
    assert torch.isfinite(x).all()
    return x


def _rows(dtype, top, d=33, seed=0):
    """x1, x2 (8, d) in dtype, the labels, and tangents of the rows' own sizes."""
    top = _top(dtype, top)
    gen = torch.Generator().manual_seed(seed)
    n = len(LABELS)
    base = torch.randn(n, d, generator=gen, dtype=torch.float64)
    other = torch.rand(n, 1, generator=gen, dtype=torch.float64) * 2 - 1
    other = other * base + 0.3 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    x1, x2 = _side(base, SIDES1, top, dtype), _side(other, SIDES2, top, dtype)
    t1 = _side(torch.randn(n, d, generator=gen, dtype=torch.float64), SIDES1, top, dtype)
    t2 = _side(torch.randn(n, d, generator=gen, dtype=torch.float64), SIDES2, top, dtype)
    return x1, x2, torch.tensor(LABELS, dtype=dtype), (t1, t2)


def _exponents(x):
    """Per row, e with x * 2^-e at most about 2^200 in magnitude (0 for rows below 2^200)."""
    top = np.abs(x).max(1)
    return np.maximum(0, np.frexp(top)[1] - 200)[:, None]


def _expected(x1, x2, y, margin=MARGIN):
    """The reference on the copies: per-row loss, and per side (dx' of the copy, its size, e),
    for an upstream gradient of 1 a row."""
    x1, x2, y = (t.detach().double().numpy() for t in (x1, x2, y))
    e1, e2 = _exponents(x1), _exponents(x2)
    a1, a2 = np.ldexp(x1, -e1), np.ldexp(x2, -e2)
    dy = np.ones(len(y))
    loss = reference.forward(a1, a2, y, margin)
    dx1, dx2 = reference.backward(dy, a1, a2, y, margin)
    m1, m2 = reference.gradient_magnitudes(dy, a1, a2, y, margin)
    return loss, ((dx1, m1, e1), (dx2, m2, e2))


def _step(dtype):
    """The spacing of dtype's subnormals: a smaller result is only as exact as this."""
    return torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps


def _assert_values(got, want, dtype, size=0.0, floor=0.0, what="loss"):
    """got (a tensor) against float64 want: NaN where want is NaN, inf where it is inf, else
    within TOLERANCES[dtype] (atol relative to `size`; 1 for a loss)."""
    rtol, atol = TOLERANCES[dtype]
    got = got.detach().double().numpy()
    want = np.broadcast_to(want, got.shape)
    size = 1.0 if what == "loss" else size
    with np.errstate(invalid="ignore"):
        ok = (np.abs(got - want) <= rtol * np.abs(want) + atol * size + floor) | (got == want)
    ok |= np.isnan(got) & np.isnan(want)
    assert ok.all(), (f"{what}: {int((~ok).sum())} of {ok.size} off, first at "
                      f"{np.argwhere(~ok)[0].tolist()}: got {got[~ok][0]!r}, want {want[~ok][0]!r}")


def _assert_gradients(got, expected_sides, dtype):
    """dx1, dx2 (tensors of the inputs' size) against the reference on the copies, scaled up by
    2^e."""
    for name, dx, (want, size, e) in zip(("dx1", "dx2"), got, expected_sides):
        assert dx.dtype == dtype
        scaled = torch.from_numpy(np.ldexp(dx.detach().double().numpy(), e))
        _assert_values(scaled, want, dtype, size, np.ldexp(_step(dtype), e), what=name)


def _assert_tangent(got, expected_sides, tangents, dtype):
    """The directional derivative per row, sum(dx1 * t1) + sum(dx2 * t2), against the
    reference's: dx = dx' * 2^-e, so it is sum(dx' * t * 2^-e) with t * 2^-e exact."""
    want, size = 0.0, 0.0
    for (dx, m, e), t in zip(expected_sides, tangents):
        t = np.ldexp(t.double().numpy(), -e)
        want, size = want + (dx * t).sum(1), size + (m * np.abs(t)).sum(1)
    _assert_values(got, want, dtype, size, _step(dtype), what="tangent")


def _none(margin=MARGIN):
    return lambda a, b, y: ct.cosine_embedding_loss(a, b, y, margin, reduction="none")


# -- each route on huge rows next to ordinary ones ---------------------------------------------


@pytest.mark.parametrize("dtype, top", CASES, ids=IDS)
def test_create_graph_backward(dtype, top):
    x1, x2, y, _ = _rows(dtype, top)
    a1, a2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    loss = _none()(a1, a2, y)
    grads = torch.autograd.grad(loss.sum(), (a1, a2), create_graph=True)
    assert all(g.requires_grad for g in grads)  # the composite backward, itself differentiable
    want, sides = _expected(x1, x2, y)
    _assert_values(loss, want, dtype)
    _assert_gradients(grads, sides, dtype)


@pytest.mark.parametrize("dtype, top", CASES, ids=IDS)
def test_vmap_over_rows(dtype, top):
    x1, x2, y, _ = _rows(dtype, top)
    loss = torch.vmap(_none())(x1, x2, y)
    grads = torch.vmap(torch.func.grad(_none(), argnums=(0, 1)))(x1, x2, y)
    want, sides = _expected(x1, x2, y)
    _assert_values(loss, want, dtype)
    _assert_gradients(grads, sides, dtype)


@pytest.mark.parametrize("dtype, top", CASES, ids=IDS)
def test_func_grad(dtype, top):
    x1, x2, y, _ = _rows(dtype, top)

    def total(a, b):
        rows = _none()(a, b, y)
        return rows.sum(), rows

    grads, loss = torch.func.grad(total, argnums=(0, 1), has_aux=True)(x1, x2)
    want, sides = _expected(x1, x2, y)
    _assert_values(loss, want, dtype)
    _assert_gradients(grads, sides, dtype)


@pytest.mark.parametrize("dtype, top", CASES, ids=IDS)
def test_func_jvp(dtype, top):
    x1, x2, y, tangents = _rows(dtype, top)
    loss, tangent = torch.func.jvp(lambda a, b: _none()(a, b, y), (x1, x2), tangents)
    want, sides = _expected(x1, x2, y)
    _assert_values(loss, want, dtype)
    _assert_tangent(tangent, sides, tangents, dtype)


@pytest.mark.parametrize("dtype, top", CASES, ids=IDS)
def test_forward_ad_dual_level(dtype, top):
    x1, x2, y, tangents = _rows(dtype, top)
    with fwAD.dual_level():
        duals = [fwAD.make_dual(x, t) for x, t in zip((x1, x2), tangents)]
        loss, tangent = fwAD.unpack_dual(_none()(*duals, y))
    want, sides = _expected(x1, x2, y)
    _assert_values(loss, want, dtype)
    _assert_tangent(tangent, sides, tangents, dtype)


@pytest.mark.parametrize("margin", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("dtype, top", CASES, ids=IDS)
def test_nan_or_infinite_margin(dtype, top, margin):
    """Torch's formula with such a margin (label -1: +inf no loss, -inf an infinite one, NaN a
    NaN one), label 1 rows as for any margin: 1 - c of the rows as they are."""
    x1, x2, y, _ = _rows(dtype, top)
    a1, a2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    loss = _none(margin)(a1, a2, y)
    loss.backward(torch.ones_like(loss))
    want, sides = _expected(x1, x2, y, margin)
    _assert_values(loss, want, dtype)
    _assert_gradients((a1.grad, a2.grad), sides, dtype)


def test_gradcheck_and_gradgradcheck_on_huge_float64_rows():
    """f(z1, z2) = loss(z1 * k1, z2 * k2) with z of moderate size and k per row up to 2^1000:
    gradcheck's steps of 1e-6 in z are steps of 1e-6 of each row, and every derivative in z is
    of moderate size, so the checks compare something. Forward mode and the gradient of the
    gradient run the composite formula. Its first-order gradient against the reference first:
    a formula that lost the huge rows would be consistently wrong and pass the checks."""
    gen = torch.Generator().manual_seed(5)
    z1, z2 = (torch.randn(6, 7, generator=gen, dtype=torch.float64) for _ in range(2))
    k1 = torch.tensor([2.0**664, 1.0, 2.0**1000, 2.0**600, 2.0**300, 1.0],
                      dtype=torch.float64)[:, None]
    k2 = torch.tensor([1.0, 2.0**700, 2.0**1000, 2.0**600, 1.0, 1.0],
                      dtype=torch.float64)[:, None]
    y = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0], dtype=torch.float64)

    def f(a, b):
        return ct.cosine_embedding_loss(a * k1, b * k2, y, MARGIN, reduction="none")

    a1, a2 = (z.clone().requires_grad_() for z in (z1, z2))
    grads = torch.autograd.grad(f(a1, a2).sum(), (a1, a2), create_graph=True)
    want, sides = _expected(z1 * k1, z2 * k2, y)
    _assert_values(f(z1, z2), want, torch.float64)
    _assert_gradients([g / k for g, k in zip(grads, (k1, k2))], sides, torch.float64)
    inputs = (z1.requires_grad_(), z2.requires_grad_())
    assert torch.autograd.gradcheck(f, inputs, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(f, inputs, check_fwd_over_rev=True)


# -- what must not change ----------------------------------------------------------------------


def _unscaled_cosine(x1, x2):
    """The formula as _composite had it before huge rows were scaled: the bits of ordinary rows."""
    r1 = torch.rsqrt((x1 * x1).sum(-1) + reference.EPS)
    r2 = torch.rsqrt((x2 * x2).sum(-1) + reference.EPS)
    return (x1 * x2).sum(-1) * r1 * r2, r1, r2


def _unscaled_loss(x1, x2, target, margin, reduction):
    a1, a2 = _composite._accumulate(x1, x2)
    c, _, _ = _unscaled_cosine(a1, a2)
    zero = torch.zeros((), dtype=c.dtype, device=c.device)
    # no gradient or tangent where c > margin is False (a NaN c or margin too), as torch's
    excess = c - margin
    negative = torch.where(c > margin, excess, torch.where(c <= margin, zero, excess.detach()))
    rows = torch.where(target == 1, 1 - c, torch.where(target == -1, negative, zero))
    if reduction == "mean":
        rows = rows.mean()
    elif reduction == "sum":
        rows = rows.sum()
    return rows.to(torch.promote_types(x1.dtype, x2.dtype))


def _unscaled_gradients(grad, x1, x2, target, margin, reduction):
    a1, a2 = _composite._accumulate(x1, x2)
    c, r1, r2 = _unscaled_cosine(a1, a2)
    dy = _composite.upstream(grad.to(c.dtype), target, reduction, c.numel())
    zero = torch.zeros((), dtype=c.dtype, device=c.device)
    coeff = torch.where(target == 1, -dy, torch.where((target == -1) & (c > margin), dy, zero))
    coeff, c, r1, r2 = (v.unsqueeze(-1) for v in (coeff, c, r1, r2))
    dx1 = coeff * (a2 * r2 - c * a1 * r1) * r1
    dx2 = coeff * (a1 * r1 - c * a2 * r2) * r2
    return dx1.to(x1.dtype), dx2.to(x2.dtype)


_INTS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _assert_same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(_INTS[got.element_size()]), want.view(_INTS[want.element_size()]))


def _ordinary(dtype1, dtype2, seed=0):
    """Rows of every ordinary size (zero and tiny ones, norms up to 2^32, below float32's BIG),
    a NaN and an inf among them, labels 1, -1, 0 and 2."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.tensor([0.0, 1e-30, 1e-8, 1e-3, 1.0, 3.0, 1e4, 1e8, 1.0, 1.0, 0.5, 2.0] * 4,
                         dtype=torch.float64)[:, None]
    x1 = torch.randn(48, 33, generator=gen, dtype=torch.float64) * sizes
    x2 = torch.randn(48, 33, generator=gen, dtype=torch.float64) * sizes.flip(0)
    x1[8, 3], x2[9, 5] = math.nan, math.inf
    y = torch.tensor([1.0, -1.0, 0.0, 2.0] * 12)
    return x1.to(dtype1), x2.to(dtype2), y


PAIRS = [(torch.float32, torch.float32), (torch.float64, torch.float64),
         (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
         (torch.float32, torch.float64), (torch.bfloat16, torch.float16)]


@pytest.mark.parametrize("dtype1, dtype2", PAIRS, ids=lambda d: str(d).split(".")[1])
def test_ordinary_rows_keep_their_bits(dtype1, dtype2):
    """The loss, the gradients, autograd's gradient and forward mode's tangent through the loss:
    bit for bit those of the unscaled formula, on rows of every ordinary size."""
    x1, x2, y = _ordinary(dtype1, dtype2)
    grad = torch.tensor(0.75)
    for reduction in ("none", "mean", "sum"):
        args = (x1, x2, y, 0.1, reduction)
        _assert_same_bits(_composite.loss(*args), _unscaled_loss(*args))
        for got, want in zip(_composite.gradients(grad, *args), _unscaled_gradients(grad, *args)):
            _assert_same_bits(got, want)
        new, old = (torch.func.grad(lambda a, b: f(a, b, y, 0.1, "sum").float(),
                                    argnums=(0, 1))(x1, x2)
                    for f in (_composite.loss, _unscaled_loss))
        for got, want in zip(new, old):
            _assert_same_bits(got, want)
        tangents = (torch.ones_like(x1), -torch.ones_like(x2))
        new, old = (torch.func.jvp(lambda a, b: f(a, b, y, 0.1, reduction), (x1, x2), tangents)
                    for f in (_composite.loss, _unscaled_loss))
        for got, want in zip(new, old):
            _assert_same_bits(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_huge_row_leaves_ordinary_rows_bitwise_alone(dtype):
    x1, x2, y = _ordinary(dtype, dtype, seed=3)
    x1[4] = x1[4] / x1[4].abs().max() * torch.finfo(dtype).max
    x2[6] = x2[6] / x2[6].abs().max() * torch.finfo(dtype).max / 2
    assert torch.isfinite(x1[4]).all() and torch.isfinite(x2[6]).all()
    others = torch.tensor([i not in (4, 6) for i in range(48)])
    grad = torch.linspace(0.5, 2.0, 48)
    args = (x1, x2, y, 0.1, "none")
    _assert_same_bits(_composite.loss(*args)[others], _unscaled_loss(*args)[others])
    for got, want in zip(_composite.gradients(grad, *args), _unscaled_gradients(grad, *args)):
        _assert_same_bits(got[others], want[others])
    assert torch.isfinite(_composite.loss(*args)[[4, 6]]).all()


def test_zero_width_rows_give_torchs_values_on_every_route():
    """D = 0 (no row is huge): 1 for label 1, max(-margin, 0) for label -1, gradients empty."""
    x1, x2 = torch.empty(4, 0), torch.empty(4, 0)
    y = torch.tensor([1.0, -1.0, 0.0, -1.0])
    want = torch.nn.functional.cosine_embedding_loss(x1, x2, y, -0.5, reduction="none")
    assert want.tolist() == [1.0, 0.5, 0.0, 0.5]
    a1, a2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    loss = _none()(a1, a2, y)
    grads = torch.autograd.grad(loss.sum(), (a1, a2), create_graph=True)
    assert torch.equal(loss, want) and all(g.shape == (4, 0) for g in grads)
    assert torch.equal(torch.vmap(_none())(x1, x2, y), want)
    loss, tangent = torch.func.jvp(lambda a, b: _none()(a, b, y), (x1, x2), (x1, x2))
    assert torch.equal(loss, want) and torch.equal(tangent, torch.zeros(4))
