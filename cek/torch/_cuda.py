"""The CUDA implementations of cek's custom ops: torch allocates every buffer on its current
stream, the kernel reads and writes them on that stream, and nothing is read back to the host
(so the ops can run under CUDA-graph capture and sync debug mode "error").

Labels and the per-row upstream gradient are prepared with torch operations, not CuPy ones: CuPy
would allocate from its own pool, which a torch CUDA graph does not own.

The first launch of a signature (kernel, and each tensor's dtype, shape and device) hands the
kernel CuPy views of the tensors and goes through every check of `cek.gpu.launch`; a later
launch of the same signature can differ only in its pointers and float scalars, so it passes
the tensors' device pointers as they are (`_Plan`). A small training step is bound by host
time, and a view and a check cost more there than the kernel's launch.

Those views are DLPack capsules (torch.utils.dlpack.to_dlpack), not `cupy.from_dlpack(tensor)`:
that asks torch's `__dlpack__` to order the export on CuPy's current stream, and torch then
records an event on its own current stream and makes the other wait on it whenever the two
differ (CuPy asks for the legacy default stream unless one is entered). Under `torch.cuda.graph`
capture that wait reaches outside the capture and fails it; elsewhere it is an event and a
cross-stream wait per tensor. A capsule, like a pointer, has no stream handshake: the kernel
runs on torch's current stream, the stream that produced the tensors, so none is needed.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.dlpack import to_dlpack

from cek import cosine_embedding_loss_split as split
from cek import gpu, validate
from cek.cosine_embedding_loss_backward import (CosineEmbeddingLossBackwardKeep,
                                                CosineEmbeddingLossBackwardRows)
from cek.cosine_embedding_loss_forward import CosineEmbeddingLossForwardRows
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from cek.cosine_embedding_loss_reduce import THREADS as REDUCE_THREADS
from cek.cosine_embedding_loss_reduce import CosineEmbeddingLossReduce
from cek.kernel_args import c_scalar

KERNEL_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
                  torch.float64: "f64"}


def _accumulation(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(x1, x2, target):
    """(x1, x2) as contiguous [N, D], labels as contiguous [N] in the accumulation dtype, none
    with torch's negative bit (a pointer, like DLPack, carries the storage, not the bit).
    float64 labels of float32 rows are mapped to exactly +-1 or 0 first: rounding could turn
    1 + 1e-12 (no label) into 1. No copy and no new tensor where the caller's already are so
    (the common step)."""
    a1, a2, y = _stored(x1).contiguous(), _stored(x2).contiguous(), _stored(target)
    if a1.dim() == 1:
        a1, a2, y = a1.view(1, -1), a2.view(1, -1), y.reshape(1)
    acc = _accumulation(x1.dtype)
    if y.dtype == torch.float64 and acc != torch.float64:
        y = torch.where(y == 1, 1.0, torch.where(y == -1, -1.0, 0.0))
    return a1, a2, _to(y, acc).contiguous()


def _stored(tensor):
    return tensor.resolve_neg()  # the tensor itself without the bit


def _like(tensor):
    """A new contiguous tensor of `tensor`'s shape, dtype and device (its fastest allocation)."""
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


def _to(tensor, dtype):
    return tensor if tensor.dtype == dtype else tensor.to(dtype)  # skips a dispatch


@functools.lru_cache(maxsize=1024)
def _kernel(kernel_class, n_dim, dtype):
    """(kernel for rows of n_dim, its argument names with None for each pointer): one instance
    per class, block size and dtype, so its memoized source and checks are found, not built."""
    block_size = kernel_class.for_n_dim(n_dim, KERNEL_DTYPES[dtype]).block_size
    kernel = _instance(kernel_class, block_size, dtype)
    return kernel, tuple(None if a.is_pointer else a.name for a in kernel.args)


@functools.lru_cache(maxsize=None)
def _instance(kernel_class, block_size, dtype):  # at most 21 block sizes x 4 dtypes a class
    return kernel_class(block_size, KERNEL_DTYPES[dtype])


class _StreamHandle:
    """torch's stream as a CuPy launch takes one: all it reads is `ptr` (`cuda_stream` is
    torch's name for it in every release). Handed to the launch rather than entered as CuPy's
    current stream, which would build a CuPy stream object per launch."""

    __slots__ = ("ptr",)

    def __init__(self, stream):
        self.ptr = stream.cuda_stream


class _Plan:
    """A launch of one signature that passed every check, as the arguments of the next ones:
    the ints (dy_stride among them: a 0-d dy is read with 0, an [N] one with 1, so the shapes
    of the signature fix it) and the launch configuration fixed, pointers and float scalars
    filled per call.
    Pointers go as Python ints, which CuPy passes as 8 bytes (int64), 0 for an absent one.
    The configuration is the one the checked arguments call for (the kernel's problem_size:
    for the reduction, whether partials are given sets the grid). `function` is the compiled
    kernel on the signature's device (cek.gpu.get_function), looked up once: the lookup hashed
    the source and asked CuPy for the device on every launch, a few microseconds of a step that
    is bound by host time on small batches."""

    __slots__ = ("kernel", "config", "args", "pointers", "floats", "function")

    def __init__(self, kernel, checked, function, config):
        self.kernel = kernel
        self.function = function
        self.config = config
        self.args = [kernel.arg_dtype(a).type(value) if a.ctype == "int" else None
                     for a, value in zip(kernel.args, checked)]
        self.pointers = tuple(i for i, a in enumerate(kernel.args) if a.is_pointer)
        self.floats = tuple((i, a.name, kernel.arg_dtype(a).type) for i, a in
                            enumerate(kernel.args) if not a.is_pointer and a.ctype != "int")

    def arguments(self, tensors, scalars):
        args = self.args.copy()
        for i, t in zip(self.pointers, tensors):
            args[i] = 0 if t is None else t.data_ptr()
        for i, name, c_type in self.floats:
            args[i] = c_scalar(c_type, scalars[name])
        return args


_plans: dict[tuple, _Plan] = {}
_MAX_PLANS = 1024  # a loop launches a few signatures; a bound for one whose shapes keep changing


def _signature(kernel_class, dtype, n, d, tensors):
    """What a launch's checks depend on besides the values of its scalars. Every tensor here
    is contiguous (made so, or allocated so, in this module)."""
    return (kernel_class, dtype, n, d,
            *[None if t is None else (t.dtype, t.shape, t.get_device()) for t in tensors])


def _launch(kernel_class, x1, tensors, n, d, **scalars):
    """Launch the kernel of x1's dtype for width d on x1's device and torch's current stream
    there, taken per call: the current stream may change between calls. `tensors` are the
    kernel's pointer arguments in order (None for an absent optional one); `scalars` its
    float arguments and its ints but n_rows and n_dim, by name. A signature not seen before has
    its sizes checked first (_check_problem). The first launch of a signature
    compiles and loads the kernel where it has not run on this device yet, which a CUDA-graph
    capture forbids: there it raises cek.gpu.CaptureError, naming the warm-up to do."""
    key = _signature(kernel_class, x1.dtype, n, d, tensors)
    plan = _plans.get(key)
    if plan is None:
        _check_problem(n, d, x1.dtype)
    cupy = gpu.require_cupy()
    device = x1.device
    stream = _StreamHandle(torch.cuda.current_stream(device))
    with cupy.cuda.Device(device.index):
        if plan is not None:
            grid, block, shared_mem = plan.config
            plan.function(grid, block, plan.arguments(tensors, scalars), shared_mem=shared_mem,
                          stream=stream)
            return
        kernel, names = _kernel(kernel_class, d, x1.dtype)
        if not gpu.is_loaded(kernel, device.index) and torch.cuda.is_current_stream_capturing():
            gpu.refuse_capture(kernel)
        views = iter(_views(cupy, kernel, tensors))
        sizes = {"n_rows": n, "n_dim": d, **scalars}
        args = [next(views) if name is None else sizes[name] for name in names]
        config = gpu.launch(kernel, *args, stream=stream)
        function = gpu.get_function(kernel)  # this device's, as the launch just used
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[key] = _Plan(kernel, args, function, config)


def _check_problem(n, d, dtype):
    """ValueError for a problem no kernel takes (rows too wide, too many rows or blocks). Here,
    where N and D are numbers, not in the code torch.compile traces, where they may be symbolic
    and a check would specialise them. A call's first launch is of its rows (N x D), so a
    problem no kernel takes is refused before anything runs; a later launch of a signature seen
    before has passed it (the reduction's launches: a block of REDUCE_THREADS for rows of any
    width)."""
    kernel_dtype = KERNEL_DTYPES[dtype]
    validate.check_gpu_problem(n, d, split.max_n_dim(kernel_dtype),
                               split.blocks_per_row(n, d, kernel_dtype))


def _views(cupy, kernel, tensors):
    """Zero-copy CuPy arrays of CUDA tensors (None stays None), as the kernel's arguments
    want them: bfloat16, which CuPy lacks, as uint16 bits. Exported as capsules, with no stream
    handshake (the module docstring)."""
    return [None if t is None else
            cupy.from_dlpack(to_dlpack(t.view(torch.uint16) if t.dtype == torch.bfloat16 else t))
            for t in tensors]


def _partials(x1, a1, a2):
    """The split's partial sums of a1 and a2's slices, in a workspace torch allocates on its
    current stream, written by CosineEmbeddingLossSplitSums; None where the one-block-per-row
    kernels run instead (cek.cosine_embedding_loss_split.splits: a few wide rows split)."""
    n, d = a1.shape
    dtype = KERNEL_DTYPES[x1.dtype]
    if n == 0 or not split.splits(n, d, dtype):
        return None
    sums = a1.new_empty(split.partials_shape(n, d, dtype), dtype=_accumulation(x1.dtype))
    _launch(split.CosineEmbeddingLossSplitSums, x1, (a1, a2, sums), n, d)
    return sums


def forward(x1, x2, target, margin, reduction):
    """The loss (torch's shape for `reduction`, the inputs' dtype) from the forward kernel, or
    the split's pair for a few wide rows."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    rows = _like(y)  # each row's loss, like the labels
    sums = _partials(x1, a1, a2)
    if sums is not None:
        _launch(split.CosineEmbeddingLossSplitForward, x1, (y, sums, rows), n, d, margin=margin)
    elif n > 0:
        _launch(CosineEmbeddingLossForwardRows, x1, (a1, a2, y, rows), n, d, margin=margin)
    return _reduced(rows, x1, reduction)


def _reduced(rows, x1, reduction):
    """The loss: the rows for "none"; else their mean or sum in x1's dtype, written by a second
    launch, of one block that adds the rows in a fixed order (kernels/
    cosine_embedding_loss_reduce.cu: the same bits run after run), into a 0-d tensor torch
    allocates on its current stream; torch's for N = 0 (mean([]) is NaN). Above two trips of
    one block, a first launch of a block per slice writes partials into a workspace torch
    allocates on its current stream too, and the second reduces those."""
    if reduction == "none":
        return _to(rows if x1.dim() == 2 else rows.view(()), x1.dtype)
    n = rows.shape[0]
    if n == 0:
        return _to(rows.mean() if reduction == "mean" else rows.sum(), x1.dtype)
    reduced, scale = x1.new_empty(()), fused_scale(n, reduction)
    # Blocks of REDUCE_THREADS for rows of any width: its launch's "width" is that block.
    blocks = _kernel(CosineEmbeddingLossReduce, REDUCE_THREADS, x1.dtype)[0].level_one_blocks(n)
    if blocks:
        partials = rows.new_empty(blocks)
        _launch(CosineEmbeddingLossReduce, x1, (rows, reduced, partials), n, REDUCE_THREADS,
                scale=scale)
        rows, n = partials, blocks
    _launch(CosineEmbeddingLossReduce, x1, (rows, reduced, None), n, REDUCE_THREADS,
            scale=scale)
    return reduced


def fused_scale(n, reduction):
    """The upstream gradient of each row's loss when the reduced loss's gradient is 1."""
    return 1.0 / n if reduction == "mean" and n > 0 else 1.0


def fused_forward(x1, x2, target, margin, reduction):
    """(loss, kept) from the fused kernel, which reads x1 and x2 once: the loss, and the
    gradients for an upstream gradient of 1 (each row's: fused_scale), which keep_backward
    turns into the gradients for the upstream gradient the backward is given. `kept` is what
    keep_backward needs: (dx1, dx2, the kernel's x1, x2 and its copy of the labels, or None for
    N = 0, and the split's partial sums or None), held so that the backward reads the very
    tensors the forward did. The kernel writes that copy of the labels as it reads them, and
    for reduction "none" the per-row losses in x1's dtype: nothing else is launched but the
    reduction of a mean or a sum."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    rows, dx1, dx2 = _like(y), _like(a1), _like(a1)
    if n == 0:
        return _reduced(rows, x1, reduction), (dx1, dx2, None, None)
    labels = _like(y)
    # The per-row losses in the accumulation dtype (a reduction's input), or in x1's where
    # "none" hands them out and x1's is another (16-bit): the kernel rounds them itself.
    loss, loss_out = rows, None
    if reduction == "none" and rows.dtype != x1.dtype:
        loss, loss_out = None, rows.new_empty(rows.shape, dtype=x1.dtype)
    sums = _partials(x1, a1, a2)
    scale = fused_scale(n, reduction)
    if sums is not None:
        _launch(split.CosineEmbeddingLossSplitFused, x1,
                (a1, a2, y, None, sums, loss, dx1, dx2, loss_out, labels), n, d, dy_stride=0,
                margin=margin, scale=scale)
    else:
        _launch(CosineEmbeddingLossFused, x1, (a1, a2, y, None, loss, dx1, dx2, loss_out, labels),
                n, d, dy_stride=0, margin=margin, scale=scale)
    result = _reduced(rows, x1, reduction) if loss_out is None else _reduced(loss_out, x1, "none")
    return result, (dx1, dx2, (a1, a2, labels), sums)


def _upstream(grad, dtype):
    """(dy, dy_stride): the loss's gradient `grad` as the gradient kernels read it, in place,
    in x1's dtype `dtype` (autograd's gradient of the loss is of the loss's dtype, x1's): a 0-d
    one (a mean's, a sum's, one row's) with dy_stride 0, one a row with 1. An expanded one (the
    gradient of the per-row losses' .sum() or .mean()) is its one value, read with 0. No copy
    is made but of a gradient in another dtype, with torch's negative bit, or strided."""
    grad = _to(_stored(grad), dtype)
    if grad.dim() == 0:
        return grad, 0
    if grad.shape[0] == 1 or grad.stride(0) == 0:
        return grad[0], 0
    return grad.contiguous(), 1


def keep_backward(grad, x1, margin, reduction, kept):
    """fused_forward's dx1, dx2 (in `kept`) made the gradients for `grad`, in place, on the
    device, in one launch: rows whose upstream gradient is the one the fused kernel used (a
    `grad` of 1) are kept as they are, the others are recomputed from x1 and x2 (after the
    split's fused forward, from the partial sums it left and each slice read again). The keep
    kernel reads the gradient as autograd gives it (no expand, multiply or cast launched
    first), and where one value of 1 stands for every row, each of its blocks reads it and
    returns. No value is read back to the host."""
    dx1, dx2, rows, sums = kept
    if rows is not None:
        n, d = dx1.shape
        dy, stride = _upstream(grad, x1.dtype)
        upstream = dict(dy_stride=stride, scale=fused_scale(n, reduction), margin=margin)
        if sums is not None:
            a1, a2, y = rows
            _launch(split.CosineEmbeddingLossSplitBackwardKeep, x1,
                    (dy, a1, a2, y, sums, dx1, dx2), n, d, **upstream)
        else:
            _launch(CosineEmbeddingLossBackwardKeep, x1, (dy, *rows, dx1, dx2), n, d, **upstream)
    return _shaped(dx1, x1), _shaped(dx2, x1)


def _shaped(dx, x1):
    return dx if x1.dim() == 2 else dx.view(x1.shape)


def backward(grad, x1, x2, target, margin, reduction):
    """(dx1, dx2) for the upstream gradient `grad` from the backward kernel, which reads x1 and
    x2 once and writes dx1 and dx2 once (the split's pair for a few wide rows: twice), and
    reads `grad` in place on the device, with the mean's 1/N as its scale."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    dx1, dx2 = _like(a1), _like(a1)
    if n == 0:
        return _shaped(dx1, x1), _shaped(dx2, x1)
    dy, stride = _upstream(grad, x1.dtype)
    upstream = dict(dy_stride=stride, scale=1.0 / n if reduction == "mean" else 1.0,
                    margin=margin)
    sums = _partials(x1, a1, a2)
    if sums is not None:
        _launch(split.CosineEmbeddingLossSplitBackward, x1, (dy, a1, a2, y, sums, dx1, dx2),
                n, d, **upstream)
    else:
        _launch(CosineEmbeddingLossBackwardRows, x1, (dy, a1, a2, y, dx1, dx2), n, d, **upstream)
    return _shaped(dx1, x1), _shaped(dx2, x1)
