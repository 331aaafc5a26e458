"""The CUDA implementations of cek's custom ops: torch allocates every buffer on its current
stream, the kernel reads and writes them through DLPack on that stream, and nothing is read back
to the host (so the ops can run under CUDA-graph capture and sync debug mode "error").

Labels and the per-row upstream gradient are prepared with torch operations, not CuPy ones: CuPy
would allocate from its own pool, which a torch CUDA graph does not own.

Tensors reach CuPy as DLPack capsules (torch.utils.dlpack.to_dlpack), not through
`cupy.from_dlpack(tensor)`: that asks torch's `__dlpack__` to order the export on CuPy's current
stream, and torch then records an event on its own current stream and makes the other wait on
it whenever the two differ (CuPy asks for the legacy default stream unless one is entered).
Under `torch.cuda.graph` capture that wait reaches outside the capture and fails it; elsewhere it
is an event and a cross-stream wait per tensor. A capsule has no stream handshake: the kernel
runs on torch's current stream, the stream that produced the tensors, so none is needed.
"""

from __future__ import annotations

import functools

import torch
from torch.utils.dlpack import to_dlpack

from cek import gpu
from cek.cosine_embedding_loss_backward import (CosineEmbeddingLossBackwardKeep,
                                                CosineEmbeddingLossBackwardRows)
from cek.cosine_embedding_loss_forward import CosineEmbeddingLossForwardRows
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused
from cek.kernel import next_power_of_two

_KERNEL_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
                  torch.float64: "f64"}


def _accumulation(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(x1, x2, target):
    """(x1, x2) as contiguous [N, D], labels as contiguous [N] in the accumulation dtype. float64
    labels are mapped to exactly +-1 or 0 first: rounding could turn 1 + 1e-12 (no label) into
    1. No copy and no new tensor where the caller's already are so (the common step)."""
    a1, a2, y = x1.contiguous(), x2.contiguous(), target
    if a1.dim() == 1:
        a1, a2, y = a1.view(1, -1), a2.view(1, -1), y.reshape(1)
    if y.dtype == torch.float64:
        y = torch.where(y == 1, 1.0, torch.where(y == -1, -1.0, 0.0))
    return a1, a2, _to(y, _accumulation(x1.dtype)).contiguous()


def _to(tensor, dtype):
    return tensor if tensor.dtype == dtype else tensor.to(dtype)  # skips a dispatch


@functools.lru_cache(maxsize=None)
def _kernel(kernel_class, block_size, dtype):
    """(kernel, its argument names with None for each pointer): one instance per kernel (at most
    21 block sizes x 4 dtypes a class), so its checks and memoized source are found, not built,
    on every launch."""
    kernel = kernel_class(block_size, _KERNEL_DTYPES[dtype])
    return kernel, tuple(None if a.is_pointer else a.name for a in kernel.args)


def _views(cupy, tensors):
    """Zero-copy CuPy arrays of CUDA tensors (None stays None); bfloat16, which CuPy lacks, as
    uint16 bits. Exported as capsules, with no stream handshake (the module docstring). A
    negated view (torch's neg bit) is resolved first: DLPack carries the storage, not the bit."""
    return [None if t is None else cupy.from_dlpack(to_dlpack(_plain(t))) for t in tensors]


def _plain(t):
    t = t.resolve_neg()  # a no-op without the bit
    return t.view(torch.uint16) if t.dtype == torch.bfloat16 else t


class _StreamHandle:
    """torch's stream as the CUDA stream protocol that cupy.cuda.Stream.from_external takes:
    torch's own Stream has `__cuda_stream__` only in recent releases, `cuda_stream` in all."""

    __slots__ = ("pointer",)

    def __init__(self, stream):
        self.pointer = stream.cuda_stream

    def __cuda_stream__(self):
        return 0, self.pointer


def _launch(cupy, kernel_class, x1, arrays, n, d, margin, **scalars):
    """Launch the kernel of x1's dtype for width d on x1's device and torch's current stream
    there, taken per call: the current stream may change between calls. `arrays` are the
    kernel's pointer arguments in order (CuPy arrays, None for an absent optional one);
    `scalars` its float arguments other than margin, by name."""
    kernel, names = _kernel(kernel_class, next_power_of_two(d), x1.dtype)
    device = x1.device
    pointers = iter(arrays)
    sizes = {"n_rows": n, "n_dim": d, "margin": margin, **scalars}
    args = [next(pointers) if name is None else sizes[name] for name in names]
    stream = torch.cuda.current_stream(device)
    with cupy.cuda.Device(device.index), cupy.cuda.Stream.from_external(_StreamHandle(stream)):
        gpu.launch(kernel, *args)


def forward(x1, x2, target, margin, reduction):
    """The loss (torch's shape for `reduction`, the inputs' dtype) from the forward kernel."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    rows = torch.empty(n, dtype=y.dtype, device=x1.device)
    reduction_args = _reduction_buffers(CosineEmbeddingLossForwardRows, x1, n, d, reduction)
    if n > 0:
        cupy = gpu.require_cupy()
        _launch(cupy, CosineEmbeddingLossForwardRows, x1,
                _views(cupy, (a1, a2, y, rows)) + _reduction_views(cupy, reduction_args), n, d,
                margin, reduction_scale=fused_scale(n, reduction))
    return _reduced(rows, x1, reduction, reduction_args)


def _reduction_buffers(kernel_class, x1, n, d, reduction):
    """(partials, counter, reduced) for the kernel's own mean or sum (kernels/cek_row.cuh,
    cek_reduce_loss), allocated by torch on its current stream; None for "none" and for N = 0.
    The counter is zeroed here (a 4-byte fill), int32 for torch, uint32 to the kernel."""
    if reduction == "none" or n == 0:
        return None
    kernel, _ = _kernel(kernel_class, next_power_of_two(d), x1.dtype)
    blocks = kernel.launch_config(n, d)[0][0]
    return (torch.empty(blocks, dtype=_accumulation(x1.dtype), device=x1.device),
            torch.zeros((), dtype=torch.int32, device=x1.device),
            torch.empty((), dtype=x1.dtype, device=x1.device))


def _reduction_views(cupy, buffers):
    if buffers is None:
        return [None, None, None]
    partials, counter, reduced = _views(cupy, buffers)
    return [partials, counter.view(cupy.uint32), reduced]


def _reduced(rows, x1, reduction, buffers):
    """The loss: the rows for "none"; else the kernel's reduced value (deterministic, in x1's
    dtype), or torch's for N = 0 (mean([]) is NaN)."""
    if reduction == "none":
        return _to(rows if x1.dim() == 2 else rows.view(()), x1.dtype)
    if buffers is not None:
        return buffers[2]
    return _to(rows.mean() if reduction == "mean" else rows.sum(), x1.dtype)


def fused_scale(n, reduction):
    """The upstream gradient of each row's loss when the reduced loss's gradient is 1."""
    return 1.0 / n if reduction == "mean" and n > 0 else 1.0


def fused_forward(x1, x2, target, margin, reduction):
    """(loss, kept) from the fused kernel, which reads x1 and x2 once: the loss, and the
    gradients for an upstream gradient of 1 (each row's: fused_scale), which keep_backward
    turns into the gradients for the upstream gradient the backward is given. `kept` is what
    keep_backward needs: (dx1, dx2, the CuPy views of x1, x2, labels, dx1 and dx2 or None for
    N = 0), so the backward exports one tensor, dy, not six."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    rows = torch.empty(n, dtype=y.dtype, device=x1.device)
    dx1, dx2 = (torch.empty((n, d), dtype=x1.dtype, device=x1.device) for _ in range(2))
    views = None
    reduction_args = _reduction_buffers(CosineEmbeddingLossFused, x1, n, d, reduction)
    if n > 0:
        cupy = gpu.require_cupy()
        v1, v2, vy, v_rows, v_dx1, v_dx2 = _views(cupy, (a1, a2, y, rows, dx1, dx2))
        scale = fused_scale(n, reduction)
        _launch(cupy, CosineEmbeddingLossFused, x1,
                [v1, v2, vy, None, v_rows, v_dx1, v_dx2] + _reduction_views(cupy, reduction_args),
                n, d, margin, scale=scale, reduction_scale=scale)
        views = (v1, v2, vy, v_dx1, v_dx2)
    return _reduced(rows, x1, reduction, reduction_args), (dx1, dx2, views)


def _per_row(grad, n, dtype):
    """The upstream gradient of each row's loss before the mean's 1/N, in the accumulation
    dtype: the loss's gradient, expanded (a view) where the loss is one value."""
    grad = _to(grad, dtype)
    return grad if grad.dim() == 1 else grad.expand(n)


def keep_backward(grad, x1, margin, reduction, kept):
    """fused_forward's dx1, dx2 (in `kept`) made the gradients for `grad`, in place, on the
    device: rows whose upstream gradient is the one the fused kernel used are kept as they are
    (the kernel reads only their dy), the others are recomputed from x1 and x2. No value is
    read back to the host."""
    dx1, dx2, views = kept
    if views is not None:
        n, d = dx1.shape
        scale = fused_scale(n, reduction)
        v1, v2, vy, v_dx1, v_dx2 = views
        # grad * scale in the accumulation dtype: exactly the fused kernel's scale where grad is
        # 1; the product of the expanded grad is a new contiguous [N] tensor.
        dy = _per_row(grad, n, _accumulation(x1.dtype)) * scale
        cupy = gpu.require_cupy()
        (v_dy,) = _views(cupy, (dy,))
        _launch(cupy, CosineEmbeddingLossBackwardKeep, x1, (v_dy, v1, v2, vy, v_dx1, v_dx2), n,
                d, margin, keep_dy=scale)
    return _shaped(dx1, x1), _shaped(dx2, x1)


def _shaped(dx, x1):
    return dx if x1.dim() == 2 else dx.view(x1.shape)


def backward(grad, x1, x2, target, margin, reduction):
    """(dx1, dx2) for the upstream gradient `grad` from the backward kernel, which reads x1 and
    x2 once and writes dx1 and dx2 once; `grad` stays on the device."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    dy = _per_row(grad, n, y.dtype)
    dy = (dy / n if reduction == "mean" else dy).contiguous()
    dx1, dx2 = (torch.empty((n, d), dtype=x1.dtype, device=x1.device) for _ in range(2))
    if n > 0:
        cupy = gpu.require_cupy()
        _launch(cupy, CosineEmbeddingLossBackwardRows, x1,
                _views(cupy, (dy, a1, a2, y, dx1, dx2)), n, d, margin)
    return _shaped(dx1, x1), _shaped(dx2, x1)
