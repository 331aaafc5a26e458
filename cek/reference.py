"""Float64 NumPy reference with exactly the kernels' semantics, per row.

    sq1 = sum x1^2, sq2 = sum x2^2, dot = sum x1*x2
    r1 = 1/sqrt(sq1 + EPS), r2 = 1/sqrt(sq2 + EPS), c = dot*r1*r2        (EPS = 1e-12, PyTorch's)

EPS is PyTorch's float constant 1e-12f widened to double (9.999999960041972e-13), as ATen adds it
in float64, so a zero or tiny float64 row gives torch's bits.
    loss = 1 - c if y == 1;  max(0, c - margin) if y == -1;  0 otherwise
    coeff = -dy if y == 1;  dy if y == -1 and c > margin;  0 otherwise
    dx1 = coeff*(x2*r2 - c*x1*r1)*r1,  dx2 = coeff*(x1*r1 - c*x2*r2)*r2

Where this differs from torch.nn.functional.cosine_embedding_loss: at c == margin exactly (y == -1)
PyTorch's clamp_min passes the gradient and this formula does not; any other label gives loss 0
here as in PyTorch. A NaN in a row gives a NaN loss for y == +-1 (max(0, NaN) is NaN, as in
PyTorch's clamp) and a NaN gradient for every label.
"""

from __future__ import annotations

import numpy as np

EPS = float(np.float32(1e-12))  # ATen's `EPSILON = 1e-12` is a float


def _rows(x1, x2, y):
    x1 = np.asarray(x1, dtype=np.float64)
    x2 = np.asarray(x2, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x1.ndim != 2 or x1.shape != x2.shape or y.shape != x1.shape[:1]:
        raise ValueError(f"expected x1, x2 [N, D] and y [N], got {x1.shape}, {x2.shape}, {y.shape}")
    return x1, x2, y


def cosine(x1, x2):
    """(c, r1, r2) per row, in float64."""
    r1 = 1.0 / np.sqrt(np.einsum("ij,ij->i", x1, x1) + EPS)
    r2 = 1.0 / np.sqrt(np.einsum("ij,ij->i", x2, x2) + EPS)
    return np.einsum("ij,ij->i", x1, x2) * r1 * r2, r1, r2


def forward(x1, x2, y, margin: float = 0.0) -> np.ndarray:
    """Per-row loss [N], float64."""
    x1, x2, y = _rows(x1, x2, y)
    c, _, _ = cosine(x1, x2)
    with np.errstate(invalid="ignore"):
        negative = np.where(c <= margin, 0.0, c - margin)  # NaN c stays NaN
    return np.where(y == 1, 1.0 - c, np.where(y == -1, negative, 0.0))


def backward(dy, x1, x2, y, margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(dx1, dx2) [N, D], float64, for the upstream gradient dy [N]."""
    x1, x2, y = _rows(x1, x2, y)
    dy = np.broadcast_to(np.asarray(dy, dtype=np.float64), y.shape)
    c, r1, r2 = cosine(x1, x2)
    with np.errstate(invalid="ignore"):
        coeff = np.where(y == 1, -dy, np.where((y == -1) & (c > margin), dy, 0.0))
    coeff, c, r1, r2 = (v[:, None] for v in (coeff, c, r1, r2))
    with np.errstate(invalid="ignore", over="ignore"):
        dx1 = coeff * (x2 * r2 - c * x1 * r1) * r1
        dx2 = coeff * (x1 * r1 - c * x2 * r2) * r2
    return dx1, dx2


def gradient_magnitudes(dy, x1, x2, y, margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Size of the two terms each gradient element is the difference of.

    dx1 = p*x2 - q1*x1 with p = coeff*r1*r2, q1 = coeff*c*r1^2 (and dx2 alike): near c = +-1 the
    terms cancel, so a float32 result is accurate relative to |p*x2| + |q1*x1|, not to |dx1|.
    Tolerances on gradients are taken relative to these.
    """
    x1, x2, y = _rows(x1, x2, y)
    dy = np.broadcast_to(np.asarray(dy, dtype=np.float64), y.shape)
    c, r1, r2 = cosine(x1, x2)
    with np.errstate(invalid="ignore"):
        coeff = np.abs(np.where(y == 1, -dy, np.where((y == -1) & (c > margin), dy, 0.0)))
    p, q1, q2 = (v[:, None] for v in (coeff * r1 * r2, coeff * np.abs(c) * r1 * r1,
                                      coeff * np.abs(c) * r2 * r2))
    return p * np.abs(x2) + q1 * np.abs(x1), p * np.abs(x1) + q2 * np.abs(x2)
