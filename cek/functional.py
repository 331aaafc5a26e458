"""The cosine embedding loss as functions on arrays: NumPy arrays in, NumPy out; CuPy in, CuPy out.

Semantics are torch.nn.functional.cosine_embedding_loss's, per row (see cek.reference):
(N, D) inputs with an (N,) target, or (D,) inputs with a 0-d target; labels other than +-1 give
loss 0 and gradient 0 (or a ValueError with validate_target=True); NaN and Inf propagate to
their row; N = 0 launches nothing, and the mean of no rows is NaN.

CuPy arrays run the GPU kernels of their own dtype (float16, float32 or float64: a float16 kernel
reads half the bytes of a float32 one) on the inputs' device and CuPy's current stream there.
float16 and float32 accumulate in float32, float64 in float64. A few wide rows (fewer than 512
of more than 16384 elements, 8192 in float64) and rows wider than 2**20 run split across blocks,
two launches (cek.cosine_embedding_loss_split): rows of up to 2**22 elements (2**23 in float16,
2**21 in float64); longer rows are a ValueError on this path.
mean and sum are cek's own: a second launch, of one block, adds the per-row losses the first one
wrote in an order fixed by the code (cosine_embedding_loss_reduce) and writes the result in the
inputs' dtype, so the result is the same bits on every run and every GPU. Above 65536 losses
(32768 in float64) a block per slice of them writes its sum first, and one block adds those:
an order fixed by the code and N alone, too.

NumPy arrays run cek.cpu: float16 and float32 accumulate in float32, float64 in float64, and
results come back in the input dtype.

bfloat16, which NumPy lacks, comes as its bits: `dtype="bfloat16"` says that x1 and x2 are uint16
arrays holding bfloat16 values (a torch.bfloat16 tensor's bits, as from `.view(torch.int16)`).
It accumulates in float32, and the results (loss, dx1, dx2) and their `out` buffers are bfloat16
bits too, rounded to nearest even once from float32, as the kernels round; target and grad
stay values of any real dtype, as for the other dtypes. On NumPy arrays no float32 copy of
x1 or x2 is made: rows are widened a block at a time (cek.cpu).

Non-contiguous inputs (transposed or sliced views) are copied to a C-contiguous array first, on
either path. Every check runs before any work, so on an error a caller's `out` buffers are
untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers

import numpy as np

from cek import cosine_embedding_loss_split as split
from cek import cpu, dtypes, gpu, validate
from cek.cosine_embedding_loss_backward import CosineEmbeddingLossBackwardRows
from cek.cosine_embedding_loss_forward import CosineEmbeddingLossForwardRows
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce

__all__ = [
    "cosine_embedding_loss",
    "cosine_embedding_loss_backward",
    "cosine_embedding_loss_fused",
]


def cosine_embedding_loss(x1, x2, target, margin=0.0, reduction="mean", *,
                          validate_target=False, out=None, dtype=None):
    """The loss: a 0-d array for reduction "mean" and "sum", one value per row for "none".

    x1, x2: (N, D) or (D,) float16/32/64 arrays, both NumPy or both CuPy on one device.
    target: (N,) or 0-d labels (any float or int dtype), the same kind of array.
    validate_target: raise ValueError naming the first label that is not +-1, and its row,
    instead of giving such rows loss 0 (on a GPU this reads one value back: a synchronisation).
    out: an array of the result's shape and the inputs' dtype to write into; it is returned.
    dtype: None (x1's own), or "bfloat16" for uint16 arrays x1, x2 of bfloat16 bits (the
    module's docstring): the result and `out` are then bits as well.
    """
    problem = _check(x1, x2, target, margin, reduction, dtype)
    (out,) = validate.check_out(out, problem, (problem.loss_shape,), ("out",)) or (None,)
    if validate_target:
        validate.check_labels(target, problem.batched)
    loss, _, _ = _run(problem, x1, x2, target, None, want_loss=True, want_grads=False,
                      out=(out, None, None))
    return loss


def cosine_embedding_loss_backward(grad, x1, x2, target, margin=0.0, reduction="mean", *,
                                   validate_target=False, out=None, dtype=None):
    """(dx1, dx2), the gradients of the loss for the upstream gradient `grad`.

    grad: a number or 0-d array for reduction "mean" and "sum"; for "none", an array shaped like
    the per-row loss. out: a pair of arrays shaped and typed like x1 to write into.
    Other arguments, dtypes and devices as in cosine_embedding_loss.
    """
    problem = _check(x1, x2, target, margin, reduction, dtype)
    validate.check_grad(grad, problem)
    out = validate.check_out(out, problem, (problem.input_shape,) * 2, ("dx1", "dx2"))
    if validate_target:
        validate.check_labels(target, problem.batched)
    _, dx1, dx2 = _run(problem, x1, x2, target, grad, want_loss=False, want_grads=True,
                       out=(None, *(out or (None, None))))
    return dx1, dx2


def cosine_embedding_loss_fused(x1, x2, target, margin=0.0, reduction="mean", grad=None, *,
                                validate_target=False, out=None, dtype=None):
    """(loss, dx1, dx2) from one pass over x1 and x2 (one kernel launch on a GPU).

    grad: the upstream gradient, as in cosine_embedding_loss_backward; None means 1 for "mean"
    and "sum" and ones for "none". out: a triple (loss, dx1, dx2) of arrays to write into.
    Other arguments, dtypes and devices as in cosine_embedding_loss.
    """
    problem = _check(x1, x2, target, margin, reduction, dtype)
    if grad is not None:  # None: _upstream gives every row the reduction's own scale
        validate.check_grad(grad, problem)
    shapes = (problem.loss_shape, problem.input_shape, problem.input_shape)
    out = validate.check_out(out, problem, shapes, ("loss", "dx1", "dx2"))
    if validate_target:
        validate.check_labels(target, problem.batched)
    return _run(problem, x1, x2, target, grad, want_loss=True, want_grads=True,
                out=out or (None, None, None))


# -- shared steps ------------------------------------------------------------------------------


def _check(x1, x2, target, margin, reduction, dtype) -> validate.Problem:
    """The Problem; for dtype="bfloat16" its dtype is uint16, which means bfloat16 bits from
    here on (validate refuses uint16 inputs otherwise)."""
    if dtype is not None:
        x1, x2 = _bfloat16_views(x1, x2, dtype)
    problem = validate.check_inputs(x1, x2, target, margin, reduction)
    if dtype is not None:
        problem = dataclasses.replace(problem, dtype=np.dtype(np.uint16))
    if problem.kind == "cupy":
        gpu.require_cupy()
        n, d, kernel_dtype = problem.n_rows, problem.n_dim, _kernel_dtype(problem)
        validate.check_gpu_problem(n, d, split.max_n_dim(kernel_dtype),
                                   split.blocks_per_row(n, d, kernel_dtype))
    return problem


def _bfloat16_views(x1, x2, dtype):
    """x1 and x2 as float16 views of their bits, so that validate's checks (array kind, masked
    arrays, device, shapes) are the public functions' own; nothing is copied."""
    if not isinstance(dtype, str) or dtype != "bfloat16":
        raise ValueError(f"dtype must be None or 'bfloat16', got {dtype!r}")
    views = []
    for name, x in (("x1", x1), ("x2", x2)):
        validate.refuse_tensor(name, x)
        if validate.array_kind(x) is None or x.dtype != np.uint16:
            got = str(x.dtype) if validate.array_kind(x) else type(x).__name__
            raise TypeError(f"dtype='bfloat16' takes {name} as a uint16 array of bfloat16 bits, "
                            f"got {got}")
        views.append(x.view(np.float16))
    return views


def _kernel_dtype(problem: validate.Problem) -> str:
    """The kernels' dtype name: uint16 inputs are bfloat16 bits (see _check)."""
    return "bf16" if problem.dtype == np.uint16 else dtypes.name_of(problem.dtype)


def _xp(problem: validate.Problem):
    return np if problem.kind == "numpy" else gpu.require_cupy()


def _upstream(problem: validate.Problem, grad):
    """(dy, scale): row r's upstream gradient is scale * dy[r], or scale when dy is None.
    dy is an [N] array for "none", a 0-d array for an array grad of "mean" or "sum", of the
    grad's own dtype (the kernels' dtype: upstream_in)."""
    scale = 1.0 / problem.n_rows if problem.reduction == "mean" else 1.0
    if grad is None or isinstance(grad, numbers.Real):  # None means 1 (ones for "none")
        return None, scale * (1.0 if grad is None else float(grad))
    return (grad.reshape(problem.n_rows) if problem.reduction == "none" else grad), scale


def upstream_in(dy, dtype: str, xp):
    """An upstream gradient array in the kernels' dtype `dtype` (bf16: its bits), as their dy
    takes it: rounded once to the inputs' type, as torch's gradient of a loss of that type is.
    The NumPy path rounds it the same way, so both paths compute with the same values."""
    return xp.ascontiguousarray(dtypes.from_float(dy, dtype, xp))


def _run(problem, x1, x2, target, grad, *, want_loss, want_grads, out):
    """Compute, reduce, cast and deliver (loss, dx1, dx2); an entry not wanted is None."""
    xp = _xp(problem)
    n, d = problem.n_rows, problem.n_dim
    on_device = xp.cuda.Device(problem.device) if xp is not np else contextlib.nullcontext()
    # A huge margin or grad rounds to inf in float32 and an Inf input gives NaN: results the
    # formula defines, not warnings (which `-W error` would turn into exceptions).
    with on_device, np.errstate(over="ignore", invalid="ignore"):
        if n == 0:
            acc = dtypes.get(_kernel_dtype(problem)).acc
            rows = xp.zeros(0, dtype=acc)
            dx1 = dx2 = xp.zeros((0, d), dtype=acc) if want_grads else None
        elif xp is np:
            rows, dx1, dx2 = _numpy_rows(problem, x1, x2, target, grad, want_loss, want_grads,
                                         out)
        else:
            rows, dx1, dx2 = _cupy_rows(problem, x1, x2, target, grad, want_loss, want_grads, out)
        # On a GPU a kernel reduced the rows (gpu_rows); NumPy rows are reduced here.
        reduced = xp is not np and n > 0
        loss = None if not want_loss else rows if reduced else _reduce(xp, rows,
                                                                         problem.reduction)
        shapes = (problem.loss_shape, problem.input_shape, problem.input_shape)
        return tuple(None if value is None else _deliver(xp, value, shape, problem, buffer)
                     for value, shape, buffer in zip((loss, dx1, dx2), shapes, out))


def _reduce(xp, rows, reduction):
    if reduction == "none":
        return rows
    if rows.size == 0:  # torch: the mean of no rows is NaN, their sum 0
        return xp.full((), np.nan if reduction == "mean" else 0.0, dtype=rows.dtype)
    # Fixed-order reductions in NumPy (pairwise) and CuPy (tree): deterministic, no atomics.
    return rows.mean() if reduction == "mean" else rows.sum()


def _deliver(xp, value, shape, problem, buffer):
    value = value.reshape(shape)
    dtype = problem.dtype
    if dtype == np.uint16 and value.dtype != dtype:  # a float32 loss to bfloat16 bits
        value = dtypes.from_float(value, "bf16", xp)
    if buffer is None:
        with np.errstate(over="ignore"):  # a float32 result too large for float16 becomes inf
            result = value.astype(dtype, copy=False)
        # NumPy reductions give scalars; the API promises 0-d arrays.
        return np.asarray(result) if isinstance(result, np.generic) else result
    if not _same_memory(value, buffer):  # the kernel may have written it in place already
        with np.errstate(over="ignore"):
            buffer[...] = value
    return buffer


def _same_memory(value, buffer) -> bool:
    if isinstance(value, np.ndarray):
        return value.ctypes.data == buffer.ctypes.data and value.size == buffer.size
    pointer = getattr(getattr(value, "data", None), "ptr", None)  # CuPy arrays
    return pointer is not None and pointer == buffer.data.ptr and value.size == buffer.size


# -- NumPy -------------------------------------------------------------------------------------


def _numpy_rows(problem, x1, x2, target, grad, want_loss, want_grads, out):
    """Per-row losses and the gradients from cek.cpu; `out` gradient buffers that can take them
    directly (C-contiguous, not overlapping an input) are written in place."""
    n, d = problem.n_rows, problem.n_dim
    a1 = np.ascontiguousarray(x1).reshape(n, d)
    a2 = np.ascontiguousarray(x2).reshape(n, d)
    y = np.asarray(target).reshape(n)
    g = None
    if want_grads:
        dtype = _kernel_dtype(problem)
        acc = dtypes.get(dtype).acc
        dy, scale = _upstream(problem, grad)
        if dy is None:
            g = acc.type(scale)
        else:  # as the kernels: scale * dy rounded to the inputs' type, in the accumulator
            g = dtypes.widen(upstream_in(dy, dtype, np), dtype).astype(acc) * acc.type(scale)
    inputs = (a1, a2, y) if grad is None or np.isscalar(grad) else (a1, a2, y, grad)
    dest = [_numpy_direct(buffer, (n, d), inputs) for buffer in out[1:]]
    return cpu.rows(a1, a2, y, problem.margin, g, want_loss=want_loss, want_grads=want_grads,
                    dx1=dest[0], dx2=dest[1], bfloat16=_kernel_dtype(problem) == "bf16")


def _numpy_direct(buffer, shape, inputs):
    """`buffer` as a [shape] view cek.cpu may write block by block, or None to write via a copy."""
    if buffer is None or not buffer.flags.c_contiguous:
        return None
    if any(np.may_share_memory(buffer, a) for a in inputs if isinstance(a, np.ndarray)):
        return None
    return buffer.reshape(shape)


# -- CuPy --------------------------------------------------------------------------------------


def _cupy_rows(problem, x1, x2, target, grad, want_loss, want_grads, out):
    """Per-row results on the current device, from the kernel of the inputs' dtype; `out` buffers
    that can take the kernel's output directly (its dtype, C-contiguous, not overlapping an
    input) are written in place."""
    cupy = gpu.require_cupy()
    n, d = problem.n_rows, problem.n_dim
    dtype = _kernel_dtype(problem)
    acc = dtypes.get(dtype).acc
    a1 = cupy.ascontiguousarray(x1).reshape(n, d)
    a2 = cupy.ascontiguousarray(x2).reshape(n, d)
    y = labels(cupy, target, acc).reshape(n)
    inputs = (a1, a2, y)
    loss_out, dx1_out, dx2_out = out
    dest = (
        _direct(cupy, loss_out, (n,), acc, inputs) if problem.reduction == "none" else None,
        _direct(cupy, dx1_out, (n, d), a1.dtype, inputs),
        _direct(cupy, dx2_out, (n, d), a1.dtype, inputs),
    )
    dy, scale = _upstream(problem, grad)
    return gpu_rows(a1, a2, y, dy, scale, problem.margin, dtype=dtype, want_loss=want_loss,
                    want_grads=want_grads, dest=dest, reduction=problem.reduction)


def labels(cupy, target, acc):
    """The kernels' labels, in their accumulation dtype. float64 labels are mapped to exactly +-1
    or 0 first, since rounding could turn a label such as 1 + 1e-12 (loss 0 on the CPU path)
    into 1.0."""
    if target.dtype == np.float64:
        target = cupy.where(target == 1, 1.0, cupy.where(target == -1, -1.0, 0.0))
    return cupy.ascontiguousarray(target, dtype=acc)


def _direct(cupy, buffer, shape, dtype, inputs):
    """`buffer` as a [shape] view of `dtype` the kernel may write, or None to write via a copy."""
    if buffer is None or buffer.dtype != dtype or not buffer.flags.c_contiguous:
        return None
    if any(cupy.may_share_memory(buffer, a) for a in inputs):  # the kernels use __restrict__
        return None
    return buffer.reshape(shape)


def gpu_rows(x1, x2, y, dy, scale, margin, *, dtype="f32", want_loss, want_grads,
             dest=(None, None, None), reduction="none"):
    """Launch the kernel that gives what is wanted, on the current device and stream (for a few
    wide rows the split's pair: its partial sums, then its kernel of the result), and for a
    mean or sum the kernel that reduces its per-row losses.

    x1, x2: C-contiguous [N, D] arrays of the kernel dtype `dtype` (f16, f32, f64; bf16 as
    uint16 bits); y: [N] labels in its accumulation dtype (float64 for f64, else float32). Row
    r's upstream gradient is scale * dy[r], or scale when dy is None (dy: [N] or 0-d, any real
    dtype, rounded to x1's type: upstream_in). dest: buffers ([N] accumulation dtype, [N, D],
    [N, D] of x1's dtype) to write into, None entries allocated here. Returns (loss [N] or
    None, dx1 or None, dx2 or None); for reduction "mean" or "sum" the loss is a 0-d array of x1's dtype, reduced from the
    per-row losses (written into dest[0] where one is given).
    """
    cupy = gpu.require_cupy()
    n, d = x1.shape
    acc = dtypes.get(dtype).acc
    loss, dx1, dx2 = dest
    if want_loss and loss is None:
        loss = cupy.empty(n, dtype=acc)
    if want_grads:
        dx1 = cupy.empty((n, d), dtype=x1.dtype) if dx1 is None else dx1
        dx2 = cupy.empty((n, d), dtype=x1.dtype) if dx2 is None else dx2
    # A few wide rows: the split's partial sums first, then its kernel of each result.
    sums = _split_sums(cupy, x1, x2, dtype)
    # The *_rows variants: several narrow rows per block, the same results (cek_row_group.cuh).
    if not want_grads:
        if sums is None:
            kernel = CosineEmbeddingLossForwardRows.for_n_dim(d, dtype)
            gpu.launch(kernel, x1, x2, y, loss, n, d, margin)
        else:
            kernel = split.CosineEmbeddingLossSplitForward.for_n_dim(d, dtype)
            gpu.launch(kernel, y, sums, loss, n, d, margin)
        return _reduced(cupy, loss, x1.dtype, dtype, reduction), None, None
    # A 0-d dy is read in place for every row (dy_stride 0): no broadcast launched. The fused
    # kernel takes no dy for a number; a backward kernel reads one, a 0-d 1 beside the scale.
    stride = 0 if dy is None or dy.ndim == 0 else 1
    if dy is None and not want_loss:
        one = dtypes.from_float(np.float32(1.0), dtype)
        dy = cupy.full((), one, dtype=dtypes.get(dtype).array)
    elif dy is not None:
        dy = upstream_in(dy, dtype, cupy)
    upstream = (dy, stride, float(scale))
    if want_loss:
        if sums is None:
            kernel = CosineEmbeddingLossFused.for_n_dim(d, dtype)
            gpu.launch(kernel, x1, x2, y, *upstream, loss, dx1, dx2, None, None, n, d, margin)
        else:
            kernel = split.CosineEmbeddingLossSplitFused.for_n_dim(d, dtype)
            gpu.launch(kernel, x1, x2, y, *upstream, sums, loss, dx1, dx2, None, None, n, d,
                       margin)
        return _reduced(cupy, loss, x1.dtype, dtype, reduction), dx1, dx2
    if sums is None:
        kernel = CosineEmbeddingLossBackwardRows.for_n_dim(d, dtype)
        gpu.launch(kernel, *upstream, x1, x2, y, dx1, dx2, n, d, margin)
    else:
        kernel = split.CosineEmbeddingLossSplitBackward.for_n_dim(d, dtype)
        gpu.launch(kernel, *upstream, x1, x2, y, sums, dx1, dx2, n, d, margin)
    return None, dx1, dx2


def _split_sums(cupy, x1, x2, dtype):
    """The split's partial sums of x1 and x2 (CuPy's allocator, its current stream), written by
    CosineEmbeddingLossSplitSums; None where the one-block-per-row kernels run instead
    (cek.cosine_embedding_loss_split.splits)."""
    n, d = x1.shape
    if not split.splits(n, d, dtype):
        return None
    sums = cupy.empty(split.partials_shape(n, d, dtype), dtype=dtypes.get(dtype).acc)
    gpu.launch(split.CosineEmbeddingLossSplitSums.for_n_dim(d, dtype), x1, x2, sums, n, d)
    return sums


def _reduced(cupy, rows, array_dtype, dtype, reduction):
    """The per-row losses `rows` for "none"; for "mean" and "sum" the 0-d array of x1's dtype
    (`array_dtype`) that cosine_embedding_loss_reduce writes from them, in a fixed order: one
    launch, or above two trips of one block a first launch of a block per slice into partials
    (CuPy's allocator, on its current stream) and the second over those."""
    if reduction not in ("mean", "sum"):
        return rows
    n = rows.shape[0]
    kernel = CosineEmbeddingLossReduce.for_dtype(dtype)
    scale = 1.0 / n if reduction == "mean" else 1.0
    reduced = cupy.empty((), dtype=array_dtype)
    blocks = kernel.level_one_blocks(n)
    if blocks:
        partials = cupy.empty(blocks, dtype=rows.dtype)
        gpu.launch(kernel, rows, reduced, n, scale, partials)
        rows, n = partials, blocks
    gpu.launch(kernel, rows, reduced, n, scale, None)
    return reduced
