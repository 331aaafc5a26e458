"""Vectorised NumPy cosine embedding loss, per row, with the kernels' semantics (cek.reference).

This is the CPU path of cek.functional, not the emulator: it runs the algebra with NumPy
instead of the `.cu` templates. Where g++ can build cek/cpu_native.cpp (cek.cpu_native), rows()
runs that instead: the same operations in the same order, so the same bits, in one pass a row;
the NumPy code below is then the fallback and the yardstick. Inputs are [N, D] C-contiguous
float16, float32 or float64 arrays, or uint16 arrays of bfloat16 bits (`bfloat16=True`);
per-row values come back in the accumulation dtype (`accumulation_dtype`), gradients in the
inputs' dtype (bfloat16: bits), written into caller buffers when given.

Rows are processed in blocks of about BLOCK_BYTES per temporary, so the temporaries stay in
cache and bounded (at most 7 per thread, whatever N), on up to MAX_THREADS threads (NumPy
releases the GIL inside an operation). A half-precision block (float16, bfloat16) is widened to
float32 and its gradients rounded back with cek.dtypes' whole-array conversions: NumPy's
float16 arithmetic and casts run element by element in software, and NumPy has no bfloat16.

Half precision: float16 and bfloat16 rows are accumulated in float32 and r1, r2 are formed
separately, never sq1*sq2. Eager PyTorch forms the product in half, which overflows to inf for
rows whose squared norms are each finite (identical vectors then get loss 1) and underflows to
0 for small ones (-inf); and a zero vector's EPS = 1e-12 rounds to 0 in half, giving NaN. In
float32 none of those happen for any finite float16 row of up to 16384 elements.

Huge rows: a squared norm above sqrt(max) of the accumulation dtype (float32: |x| from ~1e19)
would overflow, or leave r1*r2 subnormal. Such a row (and only such a row: the test is one
comparison per row, after the ordinary pass) is recomputed from copies scaled by a power of
two, exactly, and its gradient formed from the unit vectors: every finite input gets the
documented formula's loss and gradients (EPS included; it is far below such a norm). Huge rows
are recomputed in blocks as well, on the calling thread, so they too need at most 7 temporaries
of BLOCK_BYTES, however many there are (float16 rows never get there; bfloat16 rows do).

Every function is pure (no caches, no globals), so threads may call it at once, and every
reduction is NumPy's fixed-order pairwise sum, so identical inputs give identical bits.
"""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np

from cek import cpu_native, dtypes
from cek.reference import EPS

BLOCK_BYTES = 1 << 20  # per temporary of a block: fits in L2 next to its inputs
MAX_THREADS = 8  # threads of one call: 7 temporaries each, so at most 56 MiB of them in all


def accumulation_dtype(dtype) -> np.dtype:
    """float32 for float16 and float32 inputs, float64 for float64: the kernels' rule."""
    return dtypes.get(dtypes.name_of(dtype)).acc


def _row_sum(a: np.ndarray) -> np.ndarray:
    # np.add.reduce along the contiguous axis is pairwise: error grows like log(D), not D.
    return np.add.reduce(a, axis=1)


def row_loss(c: np.ndarray, y: np.ndarray, margin) -> np.ndarray:
    """1 - c for y == 1, max(0, c - margin) for y == -1, 0 for other labels.

    Written with `c <= margin` rather than np.maximum so that a NaN c stays NaN for y == -1,
    as in PyTorch's clamp and the kernels' cek_row_loss."""
    margin = c.dtype.type(margin)
    zero = c.dtype.type(0)
    negative = np.where(c <= margin, zero, c - margin)
    return np.where(y == 1, 1 - c, np.where(y == -1, negative, zero))


def row_coeff(c: np.ndarray, y: np.ndarray, margin, g) -> np.ndarray:
    """d loss / d c times the upstream gradient g (a number or one per row)."""
    margin = c.dtype.type(margin)
    g = np.broadcast_to(np.asarray(g, dtype=c.dtype), c.shape)
    return np.where(y == 1, -g, np.where((y == -1) & (c > margin), g, c.dtype.type(0)))


def rows(x1, x2, y, margin, g=None, *, want_loss=True, want_grads=True, dx1=None, dx2=None,
         bfloat16=False):
    """(per-row loss [N] in the accumulation dtype or None, dx1, dx2 [N, D] like x1 or None).

    g: the upstream gradient of each row's loss, a number or an [N] array (needed for
    gradients). dx1, dx2: C-contiguous buffers like x1, not overlapping the inputs, to write
    the gradients into; allocated when None. bfloat16: x1 and x2 are uint16 arrays holding
    bfloat16 bits, and so are dx1 and dx2.
    """
    n, d = x1.shape
    kind = "bf16" if bfloat16 else dtypes.name_of(x1.dtype)
    acc = dtypes.get(kind).acc
    loss = np.empty(n, acc) if want_loss else None
    if want_grads:
        dx1 = np.empty_like(x1) if dx1 is None else dx1
        dx2 = np.empty_like(x2) if dx2 is None else dx2
        g = np.broadcast_to(np.asarray(g, dtype=acc), (n,))
    else:
        g = dx1 = dx2 = None
    sq1, sq2 = np.empty(n, acc), np.empty(n, acc)  # the huge rows' test, after the pass
    step = _block_rows(d, acc)
    n_threads = max(1, min(MAX_THREADS, _cpus(), -(-n // step)))
    native = cpu_native.rows_function(kind) if n else None
    # Inf and NaN propagate to their row; a huge margin is inf in float32.
    with np.errstate(over="ignore", invalid="ignore"):
        if native is not None:
            _native_rows(native, n_threads, x1, x2, y, margin, g, loss, dx1, dx2, sq1, sq2)
        else:
            _numpy_rows(kind, n_threads, x1, x2, y, margin, g, loss, dx1, dx2, sq1, sq2)
        limit = np.sqrt(np.finfo(acc).max)
        huge = np.flatnonzero((sq1 > limit) | (sq2 > limit))
        if huge.size:
            _huge_rows(kind, huge, x1, x2, sq1, sq2, y, margin, g, loss, dx1, dx2)
    return loss, dx1, dx2


def _block_rows(d: int, acc: np.dtype) -> int:
    """Rows of a block: about BLOCK_BYTES per temporary in the accumulation dtype."""
    return max(1, BLOCK_BYTES // (d * acc.itemsize))


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# -- the compiled rows -------------------------------------------------------------------------


def _native_rows(function, n_threads, x1, x2, y, margin, g, loss, dx1, dx2, sq1, sq2) -> None:
    """rows() through the compiled code (cek/cpu_native.cpp): the same bits, one pass a row,
    on n_threads threads it starts itself (a Python thread pool would cost 0.3 ms a call)."""
    n, d = x1.shape
    acc = sq1.dtype
    y = np.asarray(y)
    label = (y == 1).astype(np.int8) - (y == -1).astype(np.int8)
    if g is not None and g.strides[0] not in (0, acc.itemsize):
        g = np.ascontiguousarray(g)

    def pointer(array):
        return None if array is None else array.ctypes.data

    function(pointer(x1), pointer(x2), n, d, pointer(label), float(acc.type(margin)),
             float(acc.type(EPS)), pointer(g), 0 if g is None else g.strides[0] // acc.itemsize,
             pointer(loss), pointer(dx1), pointer(dx2), pointer(sq1), pointer(sq2), n_threads)


# -- the NumPy code ----------------------------------------------------------------------------


def _numpy_rows(kind, n_threads, x1, x2, y, margin, g, loss, dx1, dx2, sq1, sq2) -> None:
    n, d = x1.shape
    acc = sq1.dtype
    step = _block_rows(d, acc)
    starts = range(0, n, step)
    half = kind in ("f16", "bf16")

    def run(thread: int) -> None:
        """Blocks thread, thread + n_threads, ...: rows are independent, so which thread
        computes a row changes none of its bits."""
        work = _Work(kind, min(step, n), d, acc, convert=half, grads=dx1 is not None)
        with np.errstate(over="ignore", invalid="ignore"):  # errstate is per thread
            for start in starts[thread::n_threads]:
                block = slice(start, min(n, start + step))
                _block(work, x1[block], x2[block], y[block], margin,
                       None if g is None else g[block], None if loss is None else loss[block],
                       None if dx1 is None else dx1[block], None if dx2 is None else dx2[block],
                       sq1[block], sq2[block])

    if n_threads == 1:
        run(0)
    else:  # NumPy releases the GIL inside each operation
        with concurrent.futures.ThreadPoolExecutor(n_threads) as pool:
            list(pool.map(run, range(n_threads)))


class _Work:
    """The temporaries of one block, allocated once per call and reused by every block."""

    def __init__(self, kind: str, m: int, d: int, acc: np.dtype, convert: bool, grads: bool):
        self.kind = kind
        self.t = np.empty((m, d), acc)
        self.a1 = np.empty((m, d), acc) if convert else None
        self.a2 = np.empty((m, d), acc) if convert else None
        self.g1 = np.empty((m, d), acc) if convert and grads else None
        self.g2 = np.empty((m, d), acc) if convert and grads else None
        self.bits = (np.empty((m, d), np.uint32), np.empty((m, d), np.uint32)) \
            if convert and grads else None


def _widened(kind, block, buffer):
    """block in the accumulation dtype: itself, or a half-precision block widened into
    `buffer` (allocated when None)."""
    if kind == "f16":
        buffer = np.empty(block.shape, np.float32) if buffer is None else buffer
        return dtypes.half_to_float(block, buffer[: len(block)])
    if kind == "bf16":
        buffer = np.empty(block.shape, np.float32) if buffer is None else buffer
        return dtypes.bfloat16_to_float(block, buffer[: len(block)])
    return block


def _rounded(kind, values, out, bits):
    """float32 `values` rounded into the half-precision `out` (float32 too large for float16
    becomes inf); bits: two uint32 scratch arrays of the shape."""
    if kind == "f16":
        return dtypes.float_to_half(values, out, bits)
    return dtypes.float_to_bfloat16(values, out, bits)


def _block(work, x1, x2, y, margin, g, loss, dx1, dx2, sq1_out, sq2_out):
    m = len(x1)
    a1, a2 = _widened(work.kind, x1, work.a1), _widened(work.kind, x2, work.a2)
    t = work.t[:m]
    sq1 = sq1_out[...] = _row_sum(np.multiply(a1, a1, out=t))
    sq2 = sq2_out[...] = _row_sum(np.multiply(a2, a2, out=t))
    dot = _row_sum(np.multiply(a1, a2, out=t))
    eps = a1.dtype.type(EPS)
    r1 = 1 / np.sqrt(sq1 + eps)
    r2 = 1 / np.sqrt(sq2 + eps)
    c = dot * r1 * r2
    if loss is not None:
        loss[...] = row_loss(c, y, margin)
    if dx1 is not None:
        # dx1 = coeff*(x2*r2 - c*x1*r1)*r1 = p*x2 - q1*x1, factored per row as the kernels do.
        # A row with a NaN or Inf has c = NaN, so q is NaN and the whole row's gradient is NaN
        # whatever its label, never a silent 0.
        coeff = row_coeff(c, y, margin, g)
        p = coeff * r1 * r2
        for a, b, q, out, wide in ((a1, a2, coeff * c * r1 * r1, dx1, work.g1),
                                   (a2, a1, coeff * c * r2 * r2, dx2, work.g2)):
            result = out if wide is None else wide[:m]
            np.multiply(b, p[:, None], out=result)
            np.subtract(result, np.multiply(a, q[:, None], out=t), out=result)
        if work.g1 is not None:
            bits = tuple(b[:m] for b in work.bits)
            _rounded(work.kind, work.g1[:m], dx1, bits)
            _rounded(work.kind, work.g2[:m], dx2, bits)


# -- huge rows ---------------------------------------------------------------------------------


def _huge_rows(kind, index, x1, x2, sq1, sq2, y, margin, g, loss, dx1, dx2):
    """Recompute the rows `index` (see the module's docstring) a block at a time."""
    step = _block_rows(x1.shape[1], sq1.dtype)
    for start in range(0, len(index), step):
        _huge_block(kind, index[start:start + step], x1, x2, sq1, sq2, y, margin, g, loss,
                    dx1, dx2)


def _finite_rows(a):
    """Per row: no Inf and no NaN (max and min carry a NaN; no temporary of the row's size)."""
    return np.isfinite(np.max(a, axis=1)) & np.isfinite(np.min(a, axis=1))


def _power_of_two_scale(a, sq, limit):
    """Per row of finite values: 2^-e with 2^(e-1) <= max|x| < 2^e where sq > limit, else 1.
    Multiplying by it is exact (bar elements below 2^-126 of the row's largest, which cannot
    count)."""
    exponent = np.frexp(np.maximum(np.max(a, axis=1), -np.min(a, axis=1)))[1]
    return np.where(sq > limit, np.ldexp(a.dtype.type(1), -exponent), a.dtype.type(1))


def _huge_block(kind, index, x1, x2, sq1, sq2, y, margin, g, loss, dx1, dx2):
    """The rows `index` from scaled copies: r = s*rho with rho = 1/sqrt(sq' + EPS*s^2) of the
    scaled row, c = dot'*rho1*rho2 and dx1 = coeff*(u2 - c*u1)*r1 with u the unit vectors
    x'*rho. A row with an Inf or NaN keeps its NaN results. Works in place on the two copies
    with one more temporary (half precision: and the rounding's three)."""
    a1, a2 = _widened(kind, x1[index], None), _widened(kind, x2[index], None)
    finite = _finite_rows(a1) & _finite_rows(a2)
    if not finite.all():
        index, a1, a2 = index[finite], a1[finite], a2[finite]
    if not index.size:
        return
    y = y[index]
    limit = np.sqrt(np.finfo(a1.dtype).max)
    s1 = _power_of_two_scale(a1, sq1[index], limit)
    s2 = _power_of_two_scale(a2, sq2[index], limit)
    a1 *= s1[:, None]  # the scaled rows x1', x2'
    a2 *= s2[:, None]
    eps = a1.dtype.type(EPS)
    t = np.multiply(a1, a1)
    rho1 = 1 / np.sqrt(_row_sum(t) + eps * s1 * s1)
    rho2 = 1 / np.sqrt(_row_sum(np.multiply(a2, a2, out=t)) + eps * s2 * s2)
    c = _row_sum(np.multiply(a1, a2, out=t)) * rho1 * rho2
    if loss is not None:
        loss[index] = row_loss(c, y, margin)
    if dx1 is None:
        return
    coeff = row_coeff(c, y, margin, g[index])[:, None]
    a1 *= rho1[:, None]  # the unit vectors u1, u2
    a2 *= rho2[:, None]
    if kind in ("f16", "bf16"):
        bits = (np.empty(t.shape, np.uint32), np.empty(t.shape, np.uint32))
        rounded = np.empty(t.shape, dx1.dtype)
    for u, v, s, rho, out in ((a1, a2, s1, rho1, dx1), (a2, a1, s2, rho2, dx2)):
        np.multiply(c[:, None], u, out=t)
        np.subtract(v, t, out=t)
        np.multiply(coeff, t, out=t)
        t *= (s * rho)[:, None]
        if kind in ("f16", "bf16"):
            out[index] = _rounded(kind, t, rounded, bits)
        else:
            out[index] = t


def forward(x1, x2, y, margin) -> np.ndarray:
    """Per-row loss [N]."""
    return rows(x1, x2, y, margin, want_grads=False)[0]


def backward(g, x1, x2, y, margin) -> tuple[np.ndarray, np.ndarray]:
    """(dx1, dx2) [N, D] for the upstream gradient g of each row's loss."""
    return rows(x1, x2, y, margin, g, want_loss=False)[1:]


def fused(g, x1, x2, y, margin) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per-row loss, dx1, dx2) from one pass over the row sums."""
    return rows(x1, x2, y, margin, g)
