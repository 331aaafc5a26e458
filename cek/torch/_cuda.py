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

import torch
from torch.utils.dlpack import to_dlpack

from cek import gpu, plan
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


class _StreamHandle:
    """torch's stream as a CuPy launch takes one: all it reads is `ptr` (`cuda_stream` is
    torch's name for it in every release). Handed to the launch rather than entered as CuPy's
    current stream, which would build a CuPy stream object per launch."""

    __slots__ = ("ptr",)

    def __init__(self, stream):
        self.ptr = stream.cuda_stream


class _Prepared:
    """A launch of one signature that passed every check, as the arguments of the next ones:
    the ints (dy_stride among them: a 0-d dy is read with 0, an [N] one with 1, so the shapes
    of the signature fix it) fixed, pointers and float scalars filled per call (a mean and a
    sum of the same rows share a signature: the reduction's scale is a float).
    Pointers go as Python ints, which CuPy passes as 8 bytes (int64), 0 for an absent one.
    The configuration is the one the checked arguments call for (gpu.launch: the plan's, or
    one wave of this device for a keep kernel). `function` is the compiled kernel on the
    signature's device (cek.gpu.get_function), looked up once: the lookup hashed the source
    and asked CuPy for the device on every launch, a few microseconds of a step that is bound
    by host time on small batches."""

    __slots__ = ("config", "args", "pointers", "floats", "function")

    def __init__(self, launch, checked, function, config):
        kernel = launch.kernel
        self.function = function
        self.config = config
        self.args = [kernel.arg_dtype(a).type(value) if a.ctype == "int" else None
                     for a, value in zip(kernel.args, checked)]
        self.pointers = tuple(i for i, a in enumerate(kernel.args) if a.is_pointer)
        self.floats = tuple((i, name, kernel.arg_dtype(a).type, name in launch.values)
                            for i, (a, name) in enumerate(zip(kernel.args, launch.args))
                            if not a.is_pointer and a.ctype != "int")

    def arguments(self, tensors, values, fixed):
        """The arguments of a launch: `tensors` its pointers' in order, `values` the call's
        float scalars, `fixed` the plan's (the reduction's scale)."""
        args = self.args.copy()
        for i, t in zip(self.pointers, tensors):
            args[i] = 0 if t is None else t.data_ptr()
        for i, name, c_type, planned in self.floats:
            args[i] = c_scalar(c_type, (fixed if planned else values)[name])
        return args


# Prepared launches by signature (Launch.key and each tensor's dtype, shape and device). A loop
# launches a few signatures; _MAX_PLANS bounds one whose shapes keep changing.
_plans: dict[tuple, _Prepared] = {}
_MAX_PLANS = 1024
_TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                 "float32": torch.float32, "float64": torch.float64}


def _run(x1, step, op, values):
    """Launch `op`'s launches of the plan `step`, in order, with the buffers in `values`, on
    x1's device and torch's current stream there, taken per call: the current stream may change
    between calls. The buffers they write that the caller does not hand in (the split's partial
    sums, the reduction's partials and result: Plan.made) are allocated first, by torch on its
    current stream."""
    launches = step.ops.get(op)
    if not launches:  # no rows: nothing runs, and CuPy is not needed
        return
    for buffer in step.made[op]:
        values[buffer.name] = x1.new_empty(buffer.shape, dtype=_TORCH_DTYPES[buffer.dtype])
    cupy = gpu.require_cupy()
    device = x1.device
    stream = _StreamHandle(torch.cuda.current_stream(device))
    with cupy.cuda.Device(device.index):
        for launch in launches:
            _launch(launch, values, cupy, device.index, stream)


def _launch(launch, values, cupy, device, stream):
    """Launch `launch` (a cek.plan Launch) on `stream` of `device`, the current one. `values`
    holds the tensors its pointers take (a name absent: a null pointer) and the call's
    scalars. The first launch of a signature compiles and loads the kernel where it has not
    run on this device yet, which a CUDA-graph capture forbids: there it raises
    cek.gpu.CaptureError, naming the warm-up to do."""
    tensors = [*map(values.get, launch.pointers)]
    key = (launch.key,
           *[None if t is None else (t.dtype, t.shape, t.get_device()) for t in tensors])
    prepared = _plans.get(key)
    if prepared is not None:
        grid, block, shared_mem = prepared.config
        prepared.function(grid, block, prepared.arguments(tensors, values, launch.values),
                          shared_mem=shared_mem, stream=stream)
        return
    kernel = launch.kernel
    if not gpu.is_loaded(kernel, device) and torch.cuda.is_current_stream_capturing():
        gpu.refuse_capture(kernel)
    views = dict(zip(launch.pointers, _views(cupy, kernel, tensors)))
    args = launch.arguments({**values, **views})
    config = gpu.launch(kernel, *args, stream=stream)
    function = gpu.get_function(kernel)  # this device's, as the launch just used
    if len(_plans) >= _MAX_PLANS:
        _plans.clear()
    _plans[key] = _Prepared(launch, args, function, config)


def _views(cupy, kernel, tensors):
    """Zero-copy CuPy arrays of CUDA tensors (None stays None), as the kernel's arguments
    want them: bfloat16, which CuPy lacks, as uint16 bits. Exported as capsules, with no stream
    handshake (the module docstring)."""
    return [None if t is None else
            cupy.from_dlpack(to_dlpack(t.view(torch.uint16) if t.dtype == torch.bfloat16 else t))
            for t in tensors]


def forward(x1, x2, target, margin, reduction):
    """The loss (torch's shape for `reduction`, the inputs' dtype): the plan's forward, the
    forward kernel, or the split's pair for a few wide rows, then the reduction."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    values = {"x1": a1, "x2": a2, "y": y, "margin": margin, "loss": _like(y)}  # loss: a row's
    step = plan.plan(n, d, KERNEL_DTYPES[x1.dtype], reduction=reduction, grads=False)
    _run(x1, step, "forward", values)
    return _reduced(values, x1, reduction)


def _reduced(values, x1, reduction):
    """The loss: the rows for "none"; else the mean or sum in x1's dtype the plan's reduction
    wrote ("reduced": one block adds the rows in a fixed order, kernels/
    cosine_embedding_loss_reduce.cu, the same bits run after run), or torch's for N = 0
    (mean([]) is NaN)."""
    rows = values.get("loss_out", values.get("loss"))
    if reduction == "none":
        return _to(rows if x1.dim() == 2 else rows.view(()), x1.dtype)
    if rows.shape[0] == 0:
        return _to(rows.mean() if reduction == "mean" else rows.sum(), x1.dtype)
    return values["reduced"]


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
    for reduction "none" the per-row losses in x1's dtype (the plan's "loss_out" where that is
    not the accumulation dtype): nothing else is launched but the reduction of a mean or a
    sum."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    rows, dx1, dx2 = _like(y), _like(a1), _like(a1)
    if n == 0:
        return _reduced({"loss": rows}, x1, reduction), (dx1, dx2, None, None)
    step = plan.plan(n, d, KERNEL_DTYPES[x1.dtype], reduction=reduction)
    values = {"x1": a1, "x2": a2, "y": y, "margin": margin, "dx1": dx1, "dx2": dx2,
              "labels": _like(y), "dy_stride": 0, "scale": fused_scale(n, reduction)}
    if step.has("loss_out"):
        values["loss_out"] = rows.new_empty(rows.shape, dtype=x1.dtype)
    else:
        values["loss"] = rows
    _run(x1, step, "fused", values)
    return (_reduced(values, x1, reduction),
            (dx1, dx2, (a1, a2, values["labels"]), values.get("sums")))


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
    device, in one launch (the plan's "keep"): rows whose upstream gradient is the one the
    fused kernel used (a `grad` of 1) are kept as they are, the others are recomputed from x1
    and x2 (after the split's fused forward, from the partial sums it left and each slice read
    again). The keep kernel reads the gradient as autograd gives it (no expand, multiply or
    cast launched first), and where one value of 1 stands for every row, each of its blocks
    reads it and returns. No value is read back to the host."""
    dx1, dx2, rows, sums = kept
    if rows is not None:
        n, d = dx1.shape
        a1, a2, labels = rows
        dy, stride = _upstream(grad, x1.dtype)
        values = {"x1": a1, "x2": a2, "y": labels, "margin": margin, "dx1": dx1, "dx2": dx2,
                  "sums": sums, "dy": dy, "dy_stride": stride, "scale": fused_scale(n, reduction)}
        step = plan.plan(n, d, KERNEL_DTYPES[x1.dtype], reduction=reduction)
        _run(x1, step, "keep", values)
    return _shaped(dx1, x1), _shaped(dx2, x1)


def _shaped(dx, x1):
    return dx if x1.dim() == 2 else dx.view(x1.shape)


def backward(grad, x1, x2, target, margin, reduction):
    """(dx1, dx2) for the upstream gradient `grad`: the plan's backward, the backward kernel,
    which reads x1 and x2 once and writes dx1 and dx2 once (the split's pair for a few wide
    rows: twice), and reads `grad` in place on the device, with the mean's 1/N as its scale."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    dx1, dx2 = _like(a1), _like(a1)
    if n == 0:
        return _shaped(dx1, x1), _shaped(dx2, x1)
    dy, stride = _upstream(grad, x1.dtype)
    values = {"x1": a1, "x2": a2, "y": y, "margin": margin, "dx1": dx1, "dx2": dx2, "dy": dy,
              "dy_stride": stride, "scale": 1.0 / n if reduction == "mean" else 1.0}
    step = plan.plan(n, d, KERNEL_DTYPES[x1.dtype], reduction=reduction, route="torch-compile")
    _run(x1, step, "backward", values)
    return _shaped(dx1, x1), _shaped(dx2, x1)
