"""cek's loss and gradient written with torch operations: differentiable by autograd, forward-mode
AD and vmap, and runnable on any device.

It serves where the kernels cannot: the gradient of the gradient (`create_graph=True`),
`torch.func` transforms and forward-mode AD, D = 0, a NaN or infinite margin, and devices other
than CPU and CUDA. The semantics are cek.reference's: c = dot * r1 * r2 with
r = 1/sqrt(|x|^2 + EPS), loss 1 - c for label 1, max(c - margin, 0) for label -1 (a gradient
only where c > margin: none at c == margin, nor for a NaN c or margin, whose loss is NaN), 0 for
any other label; float16 and bfloat16 are computed in float32 and the result cast back. x1 and
x2 may differ in dtype (as the ops, cek/torch/_ops.py): the loss is in their common dtype, each
gradient in its own input's.

Huge rows, as the kernels take them (kernels/cek_huge.cuh, "Huge rows"): a side whose squared
norm reaches BIG, about the square root of the accumulation dtype's largest value (float32:
|x| from ~1e19 overflows it, float64: from ~1e154), is summed scaled by a power of two s; c does
not change, EPS is scaled alike and r = s * rho with rho the scaled row's. s brings the row's
largest magnitude to [2, 4), not only below overflow (the kernels' fixed scales leave a float32
row up to 2^48): autograd differentiates rho = rsqrt(sq) through rho^3, rho^5, ..., which must
stay normal numbers too. s is picked from detached values, a constant to autograd, so every
derivative taken through the scaled rows is the formula's; ordinary rows are scaled by 1,
exactly, and give the bits the unscaled formula gives. Only torch operations, no branch on a
value: vmap and the other transforms see through it too.
"""

from __future__ import annotations

import torch

from cek.reference import EPS

_HALVES = (torch.float16, torch.bfloat16)

# BIG per accumulation dtype: the kernels' CekLimits::BIG, about sqrt of the largest value.
_BIG = {torch.float32: 2.0**64, torch.float64: 2.0**512}


def _accumulate(x1, x2):
    """x1 and x2 in the accumulation dtype of their common one."""
    dtype = torch.promote_types(x1.dtype, x2.dtype)
    acc = torch.float32 if dtype in _HALVES else dtype
    return x1.to(acc), x2.to(acc)


def _scales(x):
    """Per row of x (N, D) or (D,), in the accumulation dtype: 1 for an ordinary row, else the
    power of two that brings its largest magnitude to [2, 4). A row with an Inf or a NaN (whose
    scale comes out NaN) is left as it is, NaN results and all."""
    x = x.detach()
    sq = (x * x).sum(-1)
    if x.shape[-1] == 0:  # (a shape, not a value: no row of no elements is huge)
        return torch.ones_like(sq)
    top = x.abs().amax(-1)
    # top = m * 2^e with m in [0.5, 1): 4m / top is 2^(2-e) exactly, a quotient whose exact
    # value is a float, and a normal one (e is at most 128, 1024 in float64).
    s = 4 * torch.frexp(top).mantissa / top
    return torch.where((sq < _BIG[x.dtype]) | torch.isnan(s), 1.0, s)


def _side(x):
    """(x', rho, s) of one side: its rows' scales s (_scales), the rows scaled by them, and
    rho = 1/sqrt(|x'|^2 + EPS s^2), so that the formula's r is s * rho."""
    s = _scales(x)
    scaled = x * s.unsqueeze(-1)
    return scaled, torch.rsqrt((scaled * scaled).sum(-1) + EPS * s * s), s


def cosine(x1, x2):
    """(c, side1, side2) per row (over the last dimension), in the accumulation dtype; each
    side is (x', rho, s) (_side). c = dot' * rho1 * rho2: the scales cancel."""
    side1, side2 = _side(x1), _side(x2)
    c = (side1[0] * side2[0]).sum(-1) * side1[1] * side2[1]
    return c, side1, side2


def upstream(grad, target, reduction, n_rows):
    """The per-row upstream gradient for the gradient `grad` of the reduced loss."""
    if reduction == "mean":
        grad = grad / n_rows
    return grad.expand(target.shape)


def loss(x1, x2, target, margin, reduction):
    """The loss in the inputs' dtype: per row for "none", else reduced (mean of no rows: NaN)."""
    a1, a2 = _accumulate(x1, x2)
    c, _, _ = cosine(a1, a2)
    zero = torch.zeros((), dtype=c.dtype, device=c.device)
    # The gradient passes only where c > margin, as the kernels' and torch's: a NaN c or a NaN
    # margin compares False both ways and gives a NaN loss (c - margin) with no gradient.
    excess = c - margin
    negative = torch.where(c > margin, excess,
                           torch.where(c <= margin, zero, excess.detach()))
    rows = torch.where(target == 1, 1 - c, torch.where(target == -1, negative, zero))
    if reduction == "mean":
        rows = rows.mean()
    elif reduction == "sum":
        rows = rows.sum()
    return rows.to(torch.promote_types(x1.dtype, x2.dtype))


def gradients(grad, x1, x2, target, margin, reduction):
    """(dx1, dx2) for the upstream gradient `grad` of the loss, in the inputs' dtype:
    dx1 = coeff * (x2' rho2 - c x1' rho1) * rho1 * s1 (the unit vectors' difference, times r1)."""
    a1, a2 = _accumulate(x1, x2)
    c, (a1, r1, s1), (a2, r2, s2) = cosine(a1, a2)
    dy = upstream(grad.to(c.dtype), target, reduction, c.numel())
    zero = torch.zeros((), dtype=c.dtype, device=c.device)
    coeff = torch.where(target == 1, -dy, torch.where((target == -1) & (c > margin), dy, zero))
    coeff, c, r1, r2, s1, s2 = (v.unsqueeze(-1) for v in (coeff, c, r1, r2, s1, s2))
    # scaled back last: a huge row's gradient may be subnormal, rounded once
    dx1 = coeff * (a2 * r2 - c * a1 * r1) * r1 * s1
    dx2 = coeff * (a1 * r1 - c * a2 * r2) * r2 * s2
    return dx1.to(x1.dtype), dx2.to(x2.dtype)
