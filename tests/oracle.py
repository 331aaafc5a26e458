"""The tests' oracle: tolerance tables and expected values, from the float64 reference only.

Test files import from here rather than keeping their own copies, so that one table per path
says how close each dtype must come (cek.check.TOLERANCES stays the kernels' own table, shared
with `cek check`).
"""

import numpy as np

from cek import dtypes, reference
from cek.check import TOLERANCES as KERNEL_TOLERANCES  # noqa: F401  the kernels' own table

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


# The GPU glue (cek.functional and cek.torch on the kernels, tests/test_gpu_glue.py), per kernel
# dtype. An element passes where |got - want| <= rtol*|want| + atol*size, size being 1 for a loss
# and, for a gradient, the terms it is the difference of (reference.gradient_magnitudes), as
# cek.check judges kernels (cek.check.TOLERANCES, the kernels' own table, shared with `cek check`).
GLUE_TOLERANCES = {
    # The kernels' own tolerances (cek.check.TOLERANCES); the glue adds float64/float32 sums.
    "f64": {"loss": (1e-10, 1e-12), "grad": (1e-10, 1e-12)},
    "f32": {"loss": (1e-4, 1e-5), "grad": (1e-4, 1e-5)},
    # The loss comes back rounded to float16 (half an ulp is 2**-11 = 4.9e-4 relative);
    # gradients as cek.check's.
    "f16": {"loss": (1e-3, 1e-5), "grad": (1e-3, 1e-4), "scaled": (2e-3, 1e-4)},
    # Rounded to bfloat16: half an ulp is 2**-8 = 3.9e-3 relative.
    "bf16": {"loss": (8e-3, 1e-5), "grad": (8e-3, 1e-3), "scaled": (1.6e-2, 1e-3)},
}
# "scaled": cek.torch's backward multiplies the kernel's half-precision gradient by a
# grad_output other than 1 in half precision: two roundings, one ulp. f32 and f64 use "grad".

# cek.torch against torch (tests/test_torch.py), per torch dtype name of the computation:
# (rtol, atol) for losses and gradients alike.
TORCH_TOLERANCES = {
    # float64 on both sides: cek's pairwise sums and torch's differ by a few ulps.
    "float64": (1e-10, 1e-14),
    # float32 accumulation (autocast's result dtype): c is good to a few float32 ulps, and the
    # loss 1 - c, c - margin is absolute (see NUMPY_TOLERANCES for the measurements).
    "float32": (1e-5, 1e-6),
    # float32 accumulation, then one rounding to float16: half an ulp is 2**-11 = 4.9e-4.
    "float16": (1e-3, 1e-6),
    # float32 accumulation, then one rounding to bfloat16 (half an ulp is 2**-8 = 3.9e-3), and
    # under autocast a second rounding where the gradient passes back through the cast.
    "bfloat16": (8e-3, 1e-5),
}
# CUDA gradients in half precision for an upstream gradient other than 1 are rounded twice: the
# kernel's float32 result to half, then the product with grad_output in half (the weights used
# are exact in half). One ulp, 2**-10 for float16 and 2**-7 for bfloat16, plus float32's error.
TORCH_TWICE_ROUNDED = {"float16": (2e-3, 1e-6), "bfloat16": (1.6e-2, 1e-5)}


def expected_and_sizes(x1, x2, y, margin, reduction, grad):
    """expected(...) and the size each gradient element is judged by (the glue's tables)."""
    x1, x2, y = (np.asarray(a, np.float64) for a in (x1, x2, y))
    n = len(y)
    grad = np.asarray(grad, np.float64)
    if reduction == "none":
        dy = np.broadcast_to(grad, (n,))
    else:
        dy = np.full(n, float(grad) / (n if reduction == "mean" else 1))
    return (expected(x1, x2, y, margin, reduction, grad),
            reference.gradient_magnitudes(dy, x1, x2, y, margin))


def expected_rows(x1, x2, y, dy, margin):
    """Per-row loss and the gradients dx1, dx2 for per-row upstream gradients dy, in float64."""
    loss = reference.forward(x1, x2, y, margin)
    return (loss, *reference.backward(dy, x1, x2, y, margin))


# -- rows too large for a plain float32 squared norm --------------------------------------

# The smallest result each dtype's gradient keeps: the GPU flushes float32 results below 2^-126
# (-ftz, and bf16 is computed in float32); float16 stores steps of 2^-24; float64 keeps its
# subnormals, exact to 2^-1074.
KEPT = {"f32": 2.0**-126, "bf16": 2.0**-126, "f16": 2.0**-24, "f64": 2.0**-1074}


def reference_on_scaled_copies(x1, x2, y, dy, margin):
    """The float64 reference where float64 itself would overflow: each row of x1 and x2 scaled
    by a power of two (t) to a largest magnitude below 1. c and the loss do not change; dx1 of
    the scaled row is dx1 / t1 (dx1 = coeff*(x2*r2 - c*x1*r1)*r1, x*r unchanged, r1 = t1*r1')."""
    def scales(x):
        top = np.abs(x).max(1)
        return np.where(top > 1, 2.0 ** -np.frexp(top)[1].astype(np.float64), 1.0)[:, None]

    t1, t2 = scales(x1), scales(x2)
    a, b = x1 * t1, x2 * t2
    loss = reference.forward(a, b, y, margin)
    dx1, dx2 = reference.backward(dy, a, b, y, margin)
    m1, m2 = reference.gradient_magnitudes(dy, a, b, y, margin)
    return loss, dx1 * t1, dx2 * t2, m1 * t1, m2 * t2


# -- bfloat16 as bits (cek.functional's dtype="bfloat16") --------------------------------

def assert_bf16_close(got, want, kind, size=1.0):
    """bfloat16 bits `got` against float64 `want`, as the glue's bfloat16 results are judged
    (oracle.GLUE_TOLERANCES): |got - want| <= rtol*|want| + atol*size, plus bfloat16's
    subnormal step for a gradient. size: 1 for a loss, the gradient's terms for a gradient."""
    rtol, atol = GLUE_TOLERANCES["bf16"][kind]
    got = dtypes.to_float64(got, "bf16")
    want = np.broadcast_to(np.asarray(want, np.float64), got.shape)
    floor = dtypes.smallest_step("bf16") if kind == "grad" else 0.0
    bad = ~(np.abs(got - want) <= rtol * np.abs(want) + atol * np.asarray(size) + floor)
    assert not bad.any(), (f"{kind}: {int(bad.sum())} of {bad.size} off, first at "
                           f"{np.argwhere(bad)[0]}: got {got[bad][0]!r}, want {want[bad][0]!r}")
