"""Vectorised NumPy cosine embedding loss, per row, with the kernels' semantics (cek.reference).

This is the CPU path of cek.functional, not the emulator: it runs the algebra with NumPy
instead of the `.cu` templates. Inputs are [N, D] C-contiguous arrays already in the
accumulation dtype (`accumulation_dtype`); results come back in it, and the caller casts.

Half precision: float16 rows are accumulated in float32 and r1, r2 are formed separately, never
sq1*sq2. Eager PyTorch forms the product in half, which overflows to inf for rows whose squared
norms are each finite (identical vectors then get loss 1) and underflows to 0 for small ones
(-inf); and a zero vector's EPS = 1e-12 rounds to 0 in half, giving NaN. In float32 none of
those happen for any finite float16 row of up to 16384 elements.

Every function is pure (no caches, no globals), so threads may call it at once, and every
reduction is NumPy's fixed-order pairwise sum, so identical inputs give identical bits.
"""

from __future__ import annotations

import numpy as np

from cek import dtypes
from cek.reference import EPS


def accumulation_dtype(dtype) -> np.dtype:
    """float32 for float16 and float32 inputs, float64 for float64: the kernels' rule."""
    return dtypes.get(dtypes.name_of(dtype)).acc


def _row_sum(a: np.ndarray) -> np.ndarray:
    # np.add.reduce along the contiguous axis is pairwise: error grows like log(D), not D.
    return np.add.reduce(a, axis=1)


def cosine(x1: np.ndarray, x2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(c, r1, r2) per row, in the dtype of x1 and x2."""
    eps = x1.dtype.type(EPS)
    with np.errstate(over="ignore", invalid="ignore"):
        r1 = 1 / np.sqrt(_row_sum(x1 * x1) + eps)
        r2 = 1 / np.sqrt(_row_sum(x2 * x2) + eps)
        c = _row_sum(x1 * x2) * r1 * r2
    return c, r1, r2


def row_loss(c: np.ndarray, y: np.ndarray, margin) -> np.ndarray:
    """1 - c for y == 1, max(0, c - margin) for y == -1, 0 for other labels.

    Written with `c <= margin` rather than np.maximum so that a NaN c stays NaN for y == -1,
    as in PyTorch's clamp and the kernels' cek_row_loss."""
    margin = c.dtype.type(margin)
    zero = c.dtype.type(0)
    with np.errstate(invalid="ignore"):
        negative = np.where(c <= margin, zero, c - margin)
        return np.where(y == 1, 1 - c, np.where(y == -1, negative, zero))


def row_coeff(c: np.ndarray, y: np.ndarray, margin, g) -> np.ndarray:
    """d loss / d c times the upstream gradient g (a number or one per row)."""
    margin = c.dtype.type(margin)
    g = np.broadcast_to(np.asarray(g, dtype=c.dtype), c.shape)
    with np.errstate(invalid="ignore"):
        return np.where(y == 1, -g, np.where((y == -1) & (c > margin), g, c.dtype.type(0)))


def gradients(x1, x2, c, r1, r2, coeff) -> tuple[np.ndarray, np.ndarray]:
    """dx1 = coeff*(x2*r2 - c*x1*r1)*r1 and dx2 = coeff*(x1*r1 - c*x2*r2)*r2, factored per row
    as the kernels do (p = coeff*r1*r2, q = coeff*c*r^2). A row with a NaN or Inf has c = NaN,
    so q is NaN and the whole row's gradient is NaN whatever its label, never a silent 0."""
    p = (coeff * r1 * r2)[:, None]
    q1 = (coeff * c * r1 * r1)[:, None]
    q2 = (coeff * c * r2 * r2)[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        dx1 = p * x2 - q1 * x1
        dx2 = p * x1 - q2 * x2
    return dx1, dx2


def forward(x1, x2, y, margin) -> np.ndarray:
    """Per-row loss [N]."""
    c, _, _ = cosine(x1, x2)
    return row_loss(c, y, margin)


def backward(g, x1, x2, y, margin) -> tuple[np.ndarray, np.ndarray]:
    """(dx1, dx2) [N, D] for the upstream gradient g of each row's loss."""
    c, r1, r2 = cosine(x1, x2)
    return gradients(x1, x2, c, r1, r2, row_coeff(c, y, margin, g))


def fused(g, x1, x2, y, margin) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per-row loss, dx1, dx2) from one pass over the row sums."""
    c, r1, r2 = cosine(x1, x2)
    dx1, dx2 = gradients(x1, x2, c, r1, r2, row_coeff(c, y, margin, g))
    return row_loss(c, y, margin), dx1, dx2
