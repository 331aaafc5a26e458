"""The CUDA implementations of cek's custom ops: torch allocates every buffer on its current
stream, the kernel reads and writes them through DLPack on that stream, and nothing is read back
to the host (so the ops can run under CUDA-graph capture and sync debug mode "error").

Labels and the per-row upstream gradient are prepared with torch operations, not CuPy ones: CuPy
would allocate from its own pool, which a torch CUDA graph does not own.
"""

from __future__ import annotations

import torch

from cek import gpu
from cek.cosine_embedding_loss_backward import (CosineEmbeddingLossBackwardKeep,
                                                CosineEmbeddingLossBackwardRows)
from cek.cosine_embedding_loss_forward import CosineEmbeddingLossForwardRows
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused

_KERNEL_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
                  torch.float64: "f64"}


def _accumulation(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(x1, x2, target):
    """(x1, x2) as contiguous [N, D], labels as [N] in the accumulation dtype. float64 labels
    are mapped to exactly +-1 or 0 first: rounding could turn 1 + 1e-12 (no label) into 1."""
    n, d = x1.shape if x1.dim() == 2 else (1, x1.shape[0])
    # Detached: inside an autograd.Function's forward, views of an input still require grad,
    # and DLPack refuses to export such a tensor.
    x1, x2, y = x1.detach(), x2.detach(), target.detach().reshape(n)
    if y.dtype == torch.float64:
        y = torch.where(y == 1, 1.0, torch.where(y == -1, -1.0, 0.0))
    labels = y.to(_accumulation(x1.dtype)).contiguous()
    return x1.contiguous().view(n, d), x2.contiguous().view(n, d), labels


def _cupy_view(cupy, tensor):
    """A zero-copy CuPy array of a CUDA tensor; bfloat16, which CuPy lacks, as uint16 bits."""
    if tensor.dtype == torch.bfloat16:
        return cupy.from_dlpack(tensor.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(tensor)


def _launch(kernel_class, x1, tensors, n, d, margin, **scalars):
    """Launch the kernel of x1's dtype for width d on x1's device and torch's current stream
    there, taken per call: the current stream may change between calls. `tensors` are the
    kernel's pointer arguments in order (None for an absent optional one); `scalars` its float
    arguments other than margin, by name."""
    cupy = gpu.require_cupy()
    kernel = kernel_class.for_n_dim(d, _KERNEL_DTYPES[x1.dtype])
    device = x1.device
    stream = torch.cuda.current_stream(device)
    pointers = iter(None if t is None else _cupy_view(cupy, t) for t in tensors)
    sizes = {"n_rows": n, "n_dim": d, "margin": margin, **scalars}
    args = [next(pointers) if a.is_pointer else sizes[a.name] for a in kernel.args]
    with cupy.cuda.Device(device.index), cupy.cuda.Stream.from_external(stream):
        gpu.launch(kernel, *args)


def forward(x1, x2, target, margin, reduction):
    """The loss (torch's shape for `reduction`, the inputs' dtype) from the forward kernel."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    rows = torch.empty(n, dtype=y.dtype, device=x1.device)
    if n > 0:
        _launch(CosineEmbeddingLossForwardRows, x1, (a1, a2, y, rows), n, d, margin)
    return _reduced(rows, x1, reduction)


def _reduced(rows, x1, reduction):
    # torch's own reductions are fixed-order on CUDA: deterministic, and mean([]) is NaN.
    loss = rows if reduction == "none" else (rows.mean() if reduction == "mean" else rows.sum())
    return loss.view(x1.shape[:1] if x1.dim() == 2 and reduction == "none" else ()).to(x1.dtype)


def fused_scale(n, reduction):
    """The upstream gradient of each row's loss when the reduced loss's gradient is 1."""
    return 1.0 / n if reduction == "mean" and n > 0 else 1.0


def fused_forward(x1, x2, target, margin, reduction):
    """(loss, dx1, dx2) from the fused kernel, which reads x1 and x2 once: the loss, and the
    gradients for an upstream gradient of 1 (each row's: fused_scale), which keep_backward
    turns into the gradients for the upstream gradient the backward is given."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    rows = torch.empty(n, dtype=y.dtype, device=x1.device)
    dx1, dx2 = (torch.empty((n, d), dtype=x1.dtype, device=x1.device) for _ in range(2))
    if n > 0:
        _launch(CosineEmbeddingLossFused, x1, (a1, a2, y, None, rows, dx1, dx2), n, d, margin,
                scale=fused_scale(n, reduction))
    return _reduced(rows, x1, reduction), dx1, dx2


def keep_backward(grad, x1, x2, target, margin, reduction, dx1, dx2):
    """fused_forward's dx1, dx2 made the gradients for `grad`, in place, on the device: rows
    whose upstream gradient is the one the fused kernel used are kept as they are (the kernel
    reads only their dy), the others are recomputed from x1 and x2. No value is read back."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    scale = fused_scale(n, reduction)
    # grad * scale in the accumulation dtype: exactly the fused kernel's scale where grad is 1.
    dy = (grad.to(y.dtype).reshape(-1).expand(n) * scale).contiguous()
    if n > 0:
        _launch(CosineEmbeddingLossBackwardKeep, x1, (dy, a1, a2, y, dx1, dx2), n, d, margin,
                keep_dy=scale)
    return dx1.view(x1.shape), dx2.view(x1.shape)


def backward(grad, x1, x2, target, margin, reduction):
    """(dx1, dx2) for the upstream gradient `grad` from the backward kernel, which reads x1 and
    x2 once and writes dx1 and dx2 once; `grad` stays on the device."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    dy = grad.to(y.dtype).reshape(-1).expand(n)
    dy = (dy / n if reduction == "mean" else dy).contiguous()
    dx1, dx2 = (torch.empty((n, d), dtype=x1.dtype, device=x1.device) for _ in range(2))
    if n > 0:
        _launch(CosineEmbeddingLossBackwardRows, x1, (dy, a1, a2, y, dx1, dx2), n, d,
                margin)
    return dx1.view(x1.shape), dx2.view(x1.shape)
