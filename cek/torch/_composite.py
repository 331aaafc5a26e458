"""cek's loss and gradient written with torch operations: differentiable by autograd, forward-mode
AD and vmap, and runnable on any device.

It serves where the kernels cannot: the gradient of the gradient (`create_graph=True`),
`torch.func` transforms and forward-mode AD, D = 0, and devices other than CPU and CUDA.
The semantics are cek.reference's: c = dot * r1 * r2 with r = 1/sqrt(|x|^2 + EPS), loss 1 - c
for label 1, max(c - margin, 0) for label -1 (no gradient at c == margin), 0 for any other
label; float16 and bfloat16 are computed in float32 and the result cast back. x1 and x2 may
differ in dtype (as the ops, cek/torch/_ops.py): the loss is in their common dtype, each
gradient in its own input's.
"""

from __future__ import annotations

import torch

from cek.reference import EPS

_HALVES = (torch.float16, torch.bfloat16)


def _accumulate(x1, x2):
    """x1 and x2 in the accumulation dtype of their common one."""
    dtype = torch.promote_types(x1.dtype, x2.dtype)
    acc = torch.float32 if dtype in _HALVES else dtype
    return x1.to(acc), x2.to(acc)


def cosine(x1, x2):
    """(c, r1, r2) per row (over the last dimension), in the accumulation dtype."""
    r1 = torch.rsqrt((x1 * x1).sum(-1) + EPS)
    r2 = torch.rsqrt((x2 * x2).sum(-1) + EPS)
    return (x1 * x2).sum(-1) * r1 * r2, r1, r2


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
    negative = torch.where(c <= margin, zero, c - margin)  # a NaN c stays NaN
    rows = torch.where(target == 1, 1 - c, torch.where(target == -1, negative, zero))
    if reduction == "mean":
        rows = rows.mean()
    elif reduction == "sum":
        rows = rows.sum()
    return rows.to(torch.promote_types(x1.dtype, x2.dtype))


def gradients(grad, x1, x2, target, margin, reduction):
    """(dx1, dx2) for the upstream gradient `grad` of the loss, in the inputs' dtype."""
    a1, a2 = _accumulate(x1, x2)
    c, r1, r2 = cosine(a1, a2)
    dy = upstream(grad.to(c.dtype), target, reduction, c.numel())
    zero = torch.zeros((), dtype=c.dtype, device=c.device)
    coeff = torch.where(target == 1, -dy, torch.where((target == -1) & (c > margin), dy, zero))
    coeff, c, r1, r2 = (v.unsqueeze(-1) for v in (coeff, c, r1, r2))
    dx1 = coeff * (a2 * r2 - c * a1 * r1) * r1
    dx2 = coeff * (a1 * r1 - c * a2 * r2) * r2
    return dx1.to(x1.dtype), dx2.to(x2.dtype)
