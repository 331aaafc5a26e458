"""The CUDA implementations of cek's custom ops: torch allocates every buffer on its current
stream, the kernel reads and writes them through DLPack on that stream, and nothing is read back
to the host (so the ops can run under CUDA-graph capture and sync debug mode "error").

Labels and the per-row upstream gradient are prepared with torch operations, not CuPy ones: CuPy
would allocate from its own pool, which a torch CUDA graph does not own.
"""

from __future__ import annotations

import torch

from cek import gpu
from cek.cosine_embedding_loss_backward import CosineEmbeddingLossBackwardRows
from cek.cosine_embedding_loss_forward import CosineEmbeddingLossForwardRows

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


def _launch(kernel_class, x1, tensors, n, d, margin):
    """Launch the kernel of x1's dtype for width d on x1's device and torch's current stream
    there, taken per call: the current stream may change between calls."""
    cupy = gpu.require_cupy()
    kernel = kernel_class.for_n_dim(d, _KERNEL_DTYPES[x1.dtype])
    device = x1.device
    stream = torch.cuda.current_stream(device)
    with cupy.cuda.Device(device.index), cupy.cuda.Stream.from_external(stream):
        gpu.launch(kernel, *(_cupy_view(cupy, t) for t in tensors), n, d, margin)


def forward(x1, x2, target, margin, reduction):
    """The loss (torch's shape for `reduction`, the inputs' dtype) from the forward kernel."""
    a1, a2, y = _rows(x1, x2, target)
    n, d = a1.shape
    rows = torch.empty(n, dtype=y.dtype, device=x1.device)
    if n > 0:
        _launch(CosineEmbeddingLossForwardRows, x1, (a1, a2, y, rows), n, d, margin)
    # torch's own reductions are fixed-order on CUDA: deterministic, and mean([]) is NaN.
    loss = rows if reduction == "none" else (rows.mean() if reduction == "mean" else rows.sum())
    return loss.view(x1.shape[:1] if x1.dim() == 2 and reduction == "none" else ()).to(x1.dtype)


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
