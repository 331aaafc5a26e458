"""The tests' oracle: tolerance tables and expected values, from the float64 reference only.

Test files import from here rather than keeping their own copies, so that one table per path
says how close each dtype must come (cek.check.TOLERANCES stays the kernels' own table, shared
with `cek check`).
"""

import numpy as np

from cek import reference

# The NumPy path (cek.functional on NumPy arrays, cek.cpu) against the float64 reference run on
# the same (already rounded) inputs, per dtype of x1 and x2: {dtype: {"loss"|"grad": (rtol, atol)}}.
NUMPY_TOLERANCES = {
    # float64 accumulation: pairwise sums over D <= 4097 lose a few ulps (measured 9e-16 abs).
    np.float64: {"loss": (1e-12, 1e-14), "grad": (1e-10, 1e-14)},
    # float32 accumulation. The loss 1 - c or c - margin is absolute, so atol dominates
    # (measured 1.2e-7). Gradients: each of the two terms of dx1 is up to |g|*r1 in size and
    # they cancel where c is +-1 (always, at D = 1); with elements >= 0.5 and |g| <= 2 the terms
    # are <= 4, and float32 keeps 6e-8 of that (measured 2.4e-7).
    np.float32: {"loss": (1e-5, 1e-6), "grad": (1e-5, 1e-6)},
    # float32 accumulation, then one rounding to float16 (half an ulp is 2**-11 = 4.9e-4
    # relative); atol as float32's, which also covers float16's subnormal spacing (6e-8).
    np.float16: {"loss": (1e-3, 1e-6), "grad": (1e-3, 1e-6)},
}


def expected(x1, x2, y, margin, reduction, grad):
    """Float64 reference (loss, dx1, dx2) for the upstream gradient `grad` of the result."""
    x1, x2, y = (np.asarray(a, dtype=np.float64) for a in (x1, x2, y))
    rows = reference.forward(x1, x2, y, margin)
    n = len(rows)
    if reduction == "none":
        loss, dy = rows, np.asarray(grad, dtype=np.float64)
    elif reduction == "mean":
        loss, dy = rows.mean(), np.full(n, float(grad) / n)
    else:
        loss, dy = rows.sum(), np.full(n, float(grad))
    dx1, dx2 = reference.backward(dy, x1, x2, y, margin)
    return loss, dx1, dx2


def assert_close(got, want, dtype, what, table=NUMPY_TOLERANCES):
    rtol, atol = table[dtype][what]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=rtol, atol=atol)
