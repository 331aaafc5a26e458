"""Vectorised NumPy cosine embedding loss, per row, with the kernels' semantics (cek.reference).

This is the CPU path of cek.functional, not the emulator: it runs the algebra with NumPy
instead of the `.cu` templates. Where g++ can build cek/cpu_native.cpp (cek.cpu_native), rows()
runs that instead: the same operations in the same order, so the same bits, in one pass a row;
the NumPy code below is then the fallback and the yardstick. Inputs are [N, D] C-contiguous float16, float32 or float64
arrays; per-row values come back in the accumulation dtype (`accumulation_dtype`), gradients
in the inputs' dtype, written into caller buffers when given.

Rows are processed in blocks of about BLOCK_BYTES per temporary, so the temporaries stay in
cache and bounded (at most 7 per thread, whatever N), on up to MAX_THREADS threads (NumPy
releases the GIL inside an operation). A float16 block is widened to float32 and its gradients
rounded back with cek.dtypes' whole-array conversions: NumPy's float16 arithmetic and casts run
element by element in software.

Half precision: float16 rows are accumulated in float32 and r1, r2 are formed separately, never
sq1*sq2. Eager PyTorch forms the product in half, which overflows to inf for rows whose squared
norms are each finite (identical vectors then get loss 1) and underflows to 0 for small ones
(-inf); and a zero vector's EPS = 1e-12 rounds to 0 in half, giving NaN. In float32 none of
those happen for any finite float16 row of up to 16384 elements.

Huge rows: a squared norm above sqrt(max) of the accumulation dtype (float32: |x| from ~1e19)
would overflow, or leave r1*r2 subnormal. Such a row (and only such a row: the test is one
comparison per row) is recomputed from copies scaled by a power of two, exactly, and its
gradient formed from the unit vectors: every finite input gets the documented formula's loss and
gradients (EPS included; it is far below such a norm).

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


def rows(x1, x2, y, margin, g=None, *, want_loss=True, want_grads=True, dx1=None, dx2=None):
    """(per-row loss [N] in the accumulation dtype or None, dx1, dx2 [N, D] like x1 or None).

    g: the upstream gradient of each row's loss, a number or an [N] array (needed for
    gradients). dx1, dx2: C-contiguous buffers like x1, not overlapping the inputs, to write
    the gradients into; allocated when None.
    """
    n, d = x1.shape
    acc = accumulation_dtype(x1.dtype)
    loss = np.empty(n, acc) if want_loss else None
    if want_grads:
        dx1 = np.empty_like(x1) if dx1 is None else dx1
        dx2 = np.empty_like(x2) if dx2 is None else dx2
        g = np.broadcast_to(np.asarray(g, dtype=acc), (n,))
    step = max(1, BLOCK_BYTES // (d * acc.itemsize))
    starts = range(0, n, step)
    n_threads = max(1, min(MAX_THREADS, _cpus(), len(starts)))
    native = cpu_native.rows_function(x1.dtype) if n else None
    if native is not None:
        _native_rows(native, n_threads, x1, x2, y, margin, g if want_grads else None, loss,
                     dx1 if want_grads else None, dx2 if want_grads else None)
        return loss, (dx1 if want_grads else None), (dx2 if want_grads else None)

    def run(thread: int) -> None:
        """Blocks thread, thread + n_threads, ...: rows are independent, so which thread
        computes a row changes none of its bits."""
        work = _Work(min(step, n), d, acc, convert=x1.dtype != acc, grads=want_grads)
        with np.errstate(over="ignore", invalid="ignore"):  # Inf and NaN propagate to their row
            for start in starts[thread::n_threads]:
                block = slice(start, min(n, start + step))
                _block(work, x1[block], x2[block], y[block], margin,
                       g[block] if want_grads else None,
                       loss[block] if want_loss else None,
                       dx1[block] if want_grads else None, dx2[block] if want_grads else None)

    if n_threads == 1:
        run(0)
    else:  # NumPy releases the GIL inside each operation
        with concurrent.futures.ThreadPoolExecutor(n_threads) as pool:
            list(pool.map(run, range(n_threads)))
    return loss, (dx1 if want_grads else None), (dx2 if want_grads else None)


def _native_rows(function, n_threads, x1, x2, y, margin, g, loss, dx1, dx2) -> None:
    """rows() through the compiled code (cek/cpu_native.cpp): the same bits, one pass a row.
    Thread t takes the t-th of n_threads runs of consecutive rows."""
    n, d = x1.shape
    acc = accumulation_dtype(x1.dtype)
    y = np.asarray(y)
    label = (y == 1).astype(np.int8) - (y == -1).astype(np.int8)
    sq1, sq2 = np.empty(n, acc), np.empty(n, acc)
    if g is not None and g.strides[0] not in (0, acc.itemsize):
        g = np.ascontiguousarray(g)
    with np.errstate(over="ignore"):  # a huge margin is inf in float32, as in the NumPy code
        margin_acc = float(acc.type(margin))
    row, cell = d * x1.itemsize, acc.itemsize

    def at(array, first, size):
        return None if array is None else array.ctypes.data + first * size

    def run(thread: int) -> None:
        first, stop = n * thread // n_threads, n * (thread + 1) // n_threads
        function(at(x1, first, row), at(x2, first, row), stop - first, d, at(label, first, 1),
                 margin_acc, float(acc.type(EPS)),
                 at(g, first, g.strides[0] if g is not None else 0),
                 0 if g is None else g.strides[0] // cell,
                 at(loss, first, cell), at(dx1, first, row), at(dx2, first, row),
                 at(sq1, first, cell), at(sq2, first, cell))

    if n_threads == 1:
        run(0)
    else:  # ctypes releases the GIL during the call
        with concurrent.futures.ThreadPoolExecutor(n_threads) as pool:
            list(pool.map(run, range(n_threads)))
    limit = np.sqrt(np.finfo(acc).max)
    huge = np.flatnonzero((sq1 > limit) | (sq2 > limit))
    if huge.size:  # float32 and float64 only: a float16 row's squared norm stays below
        with np.errstate(over="ignore", invalid="ignore"):
            _huge_rows(huge, x1, x2, sq1, sq2, y, margin, g, loss, dx1, dx2)


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Work:
    """The temporaries of one block, allocated once per call and reused by every block."""

    def __init__(self, m: int, d: int, acc: np.dtype, convert: bool, grads: bool):
        self.t = np.empty((m, d), acc)
        self.a1 = np.empty((m, d), acc) if convert else None
        self.a2 = np.empty((m, d), acc) if convert else None
        self.g1 = np.empty((m, d), acc) if convert and grads else None
        self.g2 = np.empty((m, d), acc) if convert and grads else None
        self.bits = (np.empty((m, d), np.uint32), np.empty((m, d), np.uint32)) \
            if convert and grads else None


def _widened(buffer, block):
    """block in the accumulation dtype: itself, or a float16 block widened into `buffer`."""
    if buffer is None:
        return block
    return dtypes.half_to_float(block, buffer[: len(block)])


def _block(work, x1, x2, y, margin, g, loss, dx1, dx2):
    m = len(x1)
    a1, a2 = _widened(work.a1, x1), _widened(work.a2, x2)
    t = work.t[:m]
    sq1 = _row_sum(np.multiply(a1, a1, out=t))
    sq2 = _row_sum(np.multiply(a2, a2, out=t))
    dot = _row_sum(np.multiply(a1, a2, out=t))
    eps = a1.dtype.type(EPS)
    r1 = 1 / np.sqrt(sq1 + eps)
    r2 = 1 / np.sqrt(sq2 + eps)
    c = dot * r1 * r2
    limit = np.sqrt(np.finfo(a1.dtype).max)
    huge = np.flatnonzero((sq1 > limit) | (sq2 > limit))
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
        if work.g1 is not None:  # float32 too large for float16 becomes inf
            bits = tuple(b[:m] for b in work.bits)
            dtypes.float_to_half(work.g1[:m], dx1, bits)
            dtypes.float_to_half(work.g2[:m], dx2, bits)
    if huge.size:
        _huge_rows(huge, a1, a2, sq1, sq2, y, margin, g, loss, dx1, dx2)


def _power_of_two_scale(a, sq, limit):
    """Per row: 2^-e with 2^(e-1) <= max|x| < 2^e where sq > limit, else 1. Multiplying by it
    is exact (bar elements below 2^-126 of the row's largest, which cannot count)."""
    exponent = np.frexp(np.max(np.abs(a), axis=1))[1]
    return np.where(sq > limit, np.ldexp(a.dtype.type(1), -exponent), a.dtype.type(1))


def _huge_rows(index, a1, a2, sq1, sq2, y, margin, g, loss, dx1, dx2):
    """Recompute the rows `index` of a block from scaled copies (see the module's docstring):
    r = s*rho with rho = 1/sqrt(sq' + EPS*s^2) of the scaled row, c = dot'*rho1*rho2 and
    dx1 = coeff*(u2 - c*u1)*r1 with u the unit vectors x'*rho. A row with an Inf or NaN keeps
    its NaN results."""
    index = index[np.isfinite(a1[index]).all(axis=1) & np.isfinite(a2[index]).all(axis=1)]
    if not index.size:
        return
    a1, a2, y = a1[index], a2[index], y[index]
    limit = np.sqrt(np.finfo(a1.dtype).max)
    s1 = _power_of_two_scale(a1, sq1[index], limit)
    s2 = _power_of_two_scale(a2, sq2[index], limit)
    b1, b2 = a1 * s1[:, None], a2 * s2[:, None]
    eps = a1.dtype.type(EPS)
    rho1 = 1 / np.sqrt(_row_sum(b1 * b1) + eps * s1 * s1)
    rho2 = 1 / np.sqrt(_row_sum(b2 * b2) + eps * s2 * s2)
    c = _row_sum(b1 * b2) * rho1 * rho2
    if loss is not None:
        loss[index] = row_loss(c, y, margin)
    if dx1 is not None:
        coeff = row_coeff(c, y, margin, g[index])[:, None]
        u1, u2 = b1 * rho1[:, None], b2 * rho2[:, None]
        dx1[index] = coeff * (u2 - c[:, None] * u1) * (s1 * rho1)[:, None]
        dx2[index] = coeff * (u1 - c[:, None] * u2) * (s2 * rho2)[:, None]


def forward(x1, x2, y, margin) -> np.ndarray:
    """Per-row loss [N]."""
    return rows(x1, x2, y, margin, want_grads=False)[0]


def backward(g, x1, x2, y, margin) -> tuple[np.ndarray, np.ndarray]:
    """(dx1, dx2) [N, D] for the upstream gradient g of each row's loss."""
    return rows(x1, x2, y, margin, g, want_loss=False)[1:]


def fused(g, x1, x2, y, margin) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(per-row loss, dx1, dx2) from one pass over the row sums."""
    return rows(x1, x2, y, margin, g)
