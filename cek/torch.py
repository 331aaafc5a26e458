"""PyTorch front end: `cosine_embedding_loss` and `CosineEmbeddingLoss`, drop-in for torch's.

Needs the optional extra `cek[torch]`; `import cek` does not import torch, only `import cek.torch`.

CUDA tensors go to the GPU kernels without a copy (DLPack), on the tensor's device and
`torch.cuda.current_stream()` there. The forward launches the fused kernel once and keeps dx1,
dx2 for an upstream gradient of 1 (already divided by N for "mean"). The backward returns them
as they are when grad_output is exactly 1 (`torch.equal` against ones, as Liger does; it reads
one value back to the host), else multiplies by grad_output; so a training step whose loss is
the last operation costs one cek launch. Without any input that needs a gradient, the forward
kernel runs instead and nothing is kept. Every dtype has its own kernel: float16 and bfloat16
read half the bytes of float32 (bfloat16 goes to CuPy, which has no such dtype, as its int16
bits), and all but float64 accumulate in float32; the loss comes back in the inputs' dtype.
Rows longer than 2**20 elements (`Kernel.max_block_size`) have no GPU kernel (ValueError).

CPU tensors go through cek.functional's NumPy path: float16 and float32 are accumulated in
float32, float64 in float64, bfloat16 (which NumPy lacks) is computed in float32 and cast back.
Here the forward computes the loss only and keeps x1, x2 and target; the backward computes the
gradients for the grad_output it is given. That keeps nothing extra alive and does no gradient
work when no backward comes (evaluation).

Under torch.autocast, float16 and bfloat16 inputs are cast to float32 and the loss comes out
float32, as torch's own autocast policy does for cosine_embedding_loss; the gradients flow back
through the cast in the inputs' dtype.

Non-contiguous tensors are copied to contiguous ones first (on the GPU path, by torch on the
current stream; on the CPU path, by cek.functional).
"""

from __future__ import annotations

import torch

from cek import functional, gpu, validate
from cek.cosine_embedding_loss_fused import CosineEmbeddingLossFused

__all__ = ["CosineEmbeddingLoss", "CosineEmbeddingLossFunction", "cosine_embedding_loss"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_HALVES = (torch.float16, torch.bfloat16)


def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None,
                          reduction="mean"):
    """torch.nn.functional.cosine_embedding_loss, computed by cek (see the module docstring)."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    for name, value in (("input1", input1), ("input2", input2), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    device_type = input1.device.type
    autocast = torch.is_autocast_enabled(device_type)
    if autocast:
        # torch's autocast runs this loss in float32 (and leaves float64 alone); casting each
        # input on its own also accepts the mixed float32/bfloat16 pairs autocast produces.
        input1, input2 = (t.float() if t.dtype in _HALVES else t for t in (input1, input2))
    margin, reduction = _check(input1, input2, target, margin, reduction)
    if autocast:
        with torch.autocast(device_type=device_type, enabled=False):
            return _apply(input1, input2, target, margin, reduction)
    return _apply(input1, input2, target, margin, reduction)


class CosineEmbeddingLoss(torch.nn.Module):
    """torch.nn.CosineEmbeddingLoss, computed by cek."""

    def __init__(self, margin=0.0, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
        self.margin = validate.check_margin(margin)
        self.reduction = validate.check_reduction(reduction)

    def forward(self, input1, input2, target):
        return cosine_embedding_loss(input1, input2, target, self.margin, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, reduction={self.reduction!r}"


def _apply(input1, input2, target, margin, reduction):
    want_grads = torch.is_grad_enabled() and (input1.requires_grad or input2.requires_grad)
    return CosineEmbeddingLossFunction.apply(input1, input2, target, margin, reduction, want_grads)


def _check(input1, input2, target, margin, reduction):
    """Every check on tensors, before any work: (margin as float, reduction)."""
    for name, value in (("input1", input1), ("input2", input2)):
        if value.dtype not in _FLOATS:
            raise TypeError(
                f"{name} must be float16, bfloat16, float32 or float64, got {value.dtype}")
    if input1.dtype != input2.dtype:
        raise TypeError(f"input1 and input2 must have the same dtype, got {input1.dtype} and "
                        f"{input2.dtype}")
    if target.dtype == torch.bool or target.is_complex():
        raise TypeError(f"target must have a real float or int dtype, got {target.dtype}")
    for name, value in (("input2", input2), ("target", target)):
        if value.device != input1.device:
            raise TypeError(f"{name} is on {value.device}, but input1 is on {input1.device}")
    if input1.device.type not in ("cpu", "cuda"):
        raise TypeError(f"cek runs on CPU and CUDA tensors, got one on {input1.device}")
    n_rows, n_dim, _ = validate.check_shapes(input1.shape, input2.shape, target.shape,
                                        names=("input1", "input2"))
    margin = validate.check_margin(margin)
    reduction = validate.check_reduction(reduction)
    if input1.is_cuda:
        gpu.require_cupy()
        validate.check_gpu_problem(n_rows, n_dim, CosineEmbeddingLossFused.max_block_size)
    return margin, reduction


class CosineEmbeddingLossFunction(torch.autograd.Function):
    """apply(input1, input2, target, margin, reduction, want_grads): the loss, differentiable in
    input1 and input2. want_grads=False lets the CUDA path skip computing gradients."""

    @staticmethod
    def forward(ctx, input1, input2, target, margin, reduction, want_grads=True):
        ctx.margin, ctx.reduction, ctx.cuda = margin, reduction, input1.is_cuda
        if input1.is_cuda:
            loss, dx1, dx2 = _cuda_fused(input1, input2, target, margin, reduction, want_grads)
            if want_grads:
                ctx.save_for_backward(dx1, dx2)
            return loss
        if want_grads:
            ctx.save_for_backward(input1, input2, target)
        loss = functional.cosine_embedding_loss(
            _numpy(input1), _numpy(input2), _numpy(target), margin, reduction)
        return torch.from_numpy(loss).to(input1.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        if ctx.cuda:
            dx1, dx2 = _cuda_backward(ctx, grad_output)
        else:
            x1, x2, target = ctx.saved_tensors
            dx1, dx2 = functional.cosine_embedding_loss_backward(
                _numpy(grad_output), _numpy(x1), _numpy(x2), _numpy(target), ctx.margin,
                ctx.reduction)
            dx1, dx2 = torch.from_numpy(dx1).to(x1.dtype), torch.from_numpy(dx2).to(x2.dtype)
        return (dx1 if ctx.needs_input_grad[0] else None,
                dx2 if ctx.needs_input_grad[1] else None, None, None, None, None)


def _numpy(tensor):
    """A NumPy view of a CPU tensor (a float32 copy for bfloat16, which NumPy lacks)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.resolve_neg().resolve_conj().numpy()


def _cuda_fused(input1, input2, target, margin, reduction, want_grads):
    """(loss, dx1, dx2) on the GPU; dx1, dx2 are for an upstream gradient of 1, None when not
    wanted. Every buffer is allocated by torch, and the kernel writes into it through DLPack."""
    cupy = gpu.require_cupy()
    device = input1.device
    batched = input1.dim() == 2
    n, d = (input1.shape if batched else (1, input1.shape[0]))
    dtype = _KERNEL_DTYPES[input1.dtype]
    acc = torch.float64 if dtype == "f64" else torch.float32
    x1 = input1.detach().contiguous().view(n, d)
    x2 = input2.detach().to(input1.dtype).contiguous().view(n, d)
    y = target.detach()
    y = (y.float() if y.dtype == torch.bfloat16 else y).contiguous().view(n)  # no bf16 in CuPy
    rows = torch.empty(n, dtype=acc, device=device)
    dx1 = torch.empty((n, d), dtype=input1.dtype, device=device) if want_grads else None
    dx2 = torch.empty((n, d), dtype=input1.dtype, device=device) if want_grads else None
    if n > 0:
        stream = torch.cuda.current_stream(device)
        # CuPy's current stream becomes torch's, so from_dlpack needs no cross-stream wait and
        # the launch is ordered after the torch work that produced the inputs.
        with cupy.cuda.Device(device.index), cupy.cuda.ExternalStream(stream.cuda_stream,
                                                                      device.index):
            c1, c2 = _cupy_view(cupy, x1), _cupy_view(cupy, x2)
            labels = functional.labels(cupy, cupy.from_dlpack(y), _NUMPY_ACC[acc])
            dest = tuple(None if t is None else _cupy_view(cupy, t) for t in (rows, dx1, dx2))
            scale = 1.0 / n if reduction == "mean" else 1.0
            functional.gpu_rows(c1, c2, labels, None, scale, margin, dtype=dtype, want_loss=True,
                                want_grads=want_grads, dest=dest)
    # torch's own reductions are fixed-order on CUDA: deterministic, and mean([]) is NaN.
    loss = rows if reduction == "none" else (rows.mean() if reduction == "mean" else rows.sum())
    loss = loss.view(input1.shape[:1] if batched and reduction == "none" else ())
    if want_grads:
        dx1, dx2 = (t.view(input1.shape) for t in (dx1, dx2))
    return loss.to(input1.dtype), dx1, dx2


_KERNEL_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
                  torch.float64: "f64"}
_NUMPY_ACC = {torch.float32: "float32", torch.float64: "float64"}


def _cupy_view(cupy, tensor):
    """A zero-copy CuPy array of a CUDA tensor; bfloat16, which CuPy lacks, as uint16 bits."""
    if tensor.dtype == torch.bfloat16:
        return cupy.from_dlpack(tensor.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(tensor)


def _cuda_backward(ctx, grad_output):
    dx1, dx2 = ctx.saved_tensors
    if torch.equal(grad_output, torch.ones_like(grad_output)):
        return dx1, dx2  # the common case: the loss was the last operation
    g = grad_output
    if g.dim() == 1:  # "none" on (N, D) inputs: one gradient per row
        g = g.unsqueeze(1)
    return dx1 * g, dx2 * g
