"""cek's work as PyTorch custom ops (namespace `cek`): what torch.compile, torch.export, fake
tensors and opcheck see. Inputs reach them already checked and broadcast by cek.torch: x1, x2
(N, D) or (D,) of float dtypes, target (N,) or () of labels (a row is label 1 or -1 where its
value is 1 or -1; cek.torch turns torch's labels of any dtype into such values).

- cek::cosine_embedding_loss(x1, x2, target, margin, reduction) -> loss
- cek::cosine_embedding_loss_backward(grad, x1, x2, target, margin, reduction) -> (dx1, dx2)

x1 and x2 may differ in dtype: the ops compute in their common dtype (the loss's) and give
each gradient in its own input's dtype. Converting them here, not before the op, is what lets
autograd save the caller's x1 and x2, so that a change to one of them in place before the
backward raises, as it does for torch's loss. The ops' forward saves x1, x2 and target
(nothing new stays alive but the labels where cek.torch made them) and their backward runs
cek's backward kernel for the grad_output it is given. This is what torch.compile, export and
fake tensors run.

In eager mode cek.torch skips the dispatcher and calls the implementations through `Eager`, an
autograd.Function with the same formula. On CUDA tensors whose gradients autograd will want, its
forward runs the fused kernel (the loss and the gradients for an upstream gradient of 1 in one
pass) and holds those two N x D gradients until the backward, whose keep kernel recomputes only
the rows whose upstream gradient differs (cek/torch/_cuda.py). Neither reads a value back to
the host, so a step can be captured in a CUDA graph. With create_graph=True the backward is the
composite torch formula instead, so it can itself be differentiated.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from cek import functional
from cek.torch import _composite, _cuda

_HALVES = (torch.float16, torch.bfloat16)


def _numpy(tensor):
    """A NumPy view of a CPU tensor (a float32 copy of a bfloat16 label or gradient: N values)."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.resolve_neg().resolve_conj().numpy()


def _rows(tensor):
    """x1 or x2 for cek.functional, and the keyword that says what they hold: bfloat16 rows go
    as their uint16 bits (NumPy has no bfloat16), read in place, with no float32 copy."""
    if tensor.dtype != torch.bfloat16:
        return _numpy(tensor), {}
    bits = tensor.detach().resolve_neg().view(torch.int16).numpy().view(np.uint16)
    return bits, {"dtype": "bfloat16"}


def _tensor(array, dtype):
    """A result of cek.functional as a tensor of `dtype` (bfloat16 results come as bits)."""
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array).to(dtype)


def _loss_shape(x1, reduction):
    return x1.shape[:1] if x1.dim() == 2 and reduction == "none" else ()


def _promoted(x1, x2):
    """x1 and x2 in their common dtype, the loss's (torch's promotion)."""
    if x1.dtype == x2.dtype:
        return x1, x2
    dtype = torch.promote_types(x1.dtype, x2.dtype)
    return x1.to(dtype), x2.to(dtype)


def loss(x1, x2, target, margin, reduction):
    """The loss op's implementation on CPU and CUDA tensors."""
    if not math.isfinite(margin):  # torch computes with these; cek's kernels and CPU path don't
        return _composite.loss(x1, x2, target, margin, reduction)
    cuda = x1.is_cuda
    x1, x2 = _promoted(x1, x2)
    if cuda:
        return _cuda.forward(x1, x2, target, margin, reduction)
    (a, how), (b, _) = _rows(x1), _rows(x2)
    loss = functional.cosine_embedding_loss(a, b, _numpy(target), margin, reduction, **how)
    return _tensor(np.asarray(loss), x1.dtype)


@torch.library.custom_op("cek::cosine_embedding_loss", mutates_args=(),
                         device_types=("cpu", "cuda"))
def loss_op(x1: torch.Tensor, x2: torch.Tensor, target: torch.Tensor, margin: float,
            reduction: str) -> torch.Tensor:
    return loss(x1, x2, target, margin, reduction)


@loss_op.register_fake
def _(x1, x2, target, margin, reduction):
    return x1.new_empty(_loss_shape(x1, reduction), dtype=torch.promote_types(x1.dtype, x2.dtype))


def backward(grad, x1, x2, target, margin, reduction):
    """The backward op's implementation on CPU and CUDA tensors."""
    if not math.isfinite(margin):
        return _composite.gradients(grad, x1, x2, target, margin, reduction)
    a1, a2 = _promoted(x1, x2)
    if x1.is_cuda:
        dx1, dx2 = _cuda.backward(grad, a1, a2, target, margin, reduction)
    else:
        (a, how), (b, _) = _rows(a1), _rows(a2)
        dx1, dx2 = functional.cosine_embedding_loss_backward(
            _numpy(grad), a, b, _numpy(target), margin, reduction, **how)
        dx1, dx2 = _tensor(dx1, a1.dtype), _tensor(dx2, a1.dtype)
    return _own_dtypes(dx1, dx2, x1, x2)


def _own_dtypes(dx1, dx2, x1, x2):
    """Each gradient in its own input's dtype."""
    return (dx1 if dx1.dtype == x1.dtype else dx1.to(x1.dtype),
            dx2 if dx2.dtype == x2.dtype else dx2.to(x2.dtype))


@torch.library.custom_op("cek::cosine_embedding_loss_backward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def backward_op(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, target: torch.Tensor,
                margin: float, reduction: str) -> tuple[torch.Tensor, torch.Tensor]:
    return backward(grad, x1, x2, target, margin, reduction)


@backward_op.register_fake
def _(grad, x1, x2, target, margin, reduction):
    # As the real op: new contiguous tensors of x1's shape, each in its input's dtype,
    # whatever x1's strides; empty_like would keep a transposed x1's strides.
    return x1.new_empty(x1.shape), x2.new_empty(x1.shape)


def _setup_context(ctx, inputs, output):
    x1, x2, target, margin, reduction = inputs
    ctx.save_for_backward(x1, x2, target)
    ctx.margin, ctx.reduction = margin, reduction


def _backward(ctx, grad, run=backward_op):
    x1, x2, target = ctx.saved_tensors
    if target is None:  # the eager fused route: the fused kernel's copy of the labels
        target = ctx.labels
    fused, ctx.fused = getattr(ctx, "fused", None), None  # handed out at most once
    if torch.is_grad_enabled():  # create_graph=True: a backward autograd can differentiate
        dx1, dx2 = _composite.gradients(grad, x1, x2, target, ctx.margin, ctx.reduction)
    elif fused is not None:
        kept, a1 = fused
        dx1, dx2 = _own_dtypes(*_cuda.keep_backward(grad, a1, ctx.margin, ctx.reduction, kept),
                               x1, x2)
    else:
        dx1, dx2 = run(grad, x1, x2, target, ctx.margin, ctx.reduction)
    return (dx1 if ctx.needs_input_grad[0] else None,
            dx2 if ctx.needs_input_grad[1] else None, None, None, None)


loss_op.register_autograd(_backward, setup_context=_setup_context)


class Eager(torch.autograd.Function):
    """The loss op's autograd, calling the implementations directly: in eager mode the custom
    op's dispatch alone cost 49 microseconds a call on a 2-core CPU (docs/torch.md), more than
    a kernel launch. torch.compile and export see the ops (cek.torch picks)."""

    # forward(ctx, ...) rather than setup_context: with setup_context, Function.apply binds
    # the arguments through inspect.signature on every call (about 90 microseconds a step here).
    @staticmethod
    def forward(ctx, x1, x2, target, margin, reduction, fuse):
        """fuse: CUDA inputs whose gradients autograd will want. The fused kernel then gives
        the loss and the gradients for an upstream gradient of 1 in one pass, kept for the
        backward (two N x D buffers alive in between), which only corrects the rows whose
        upstream gradient is not that (docs/torch.md), and a copy of the labels for it
        (cek.torch then hands the caller's labels over uncopied)."""
        inputs = (x1, x2, target, margin, reduction)
        if not fuse or not math.isfinite(margin):
            _setup_context(ctx, inputs, None)
            return loss(*inputs)
        a1, a2 = _promoted(x1, x2)
        result, kept = _cuda.fused_forward(a1, a2, target, margin, reduction)
        # The labels the backward reads are the kernel's copy, not the caller's tensor, which
        # may be refilled in place before the backward (torch's loss saves its comparisons):
        # saved, it would fail autograd's version check there.
        _setup_context(ctx, (x1, x2, None, margin, reduction), None)
        ctx.labels = target if kept[2] is None else kept[2][2].view(target.shape)
        ctx.fused = kept, a1  # a1: what the kernels read as x1, for the dtype and shape
        return result

    @staticmethod
    def backward(ctx, grad):
        return (*_backward(ctx, grad, run=backward), None)


# Eager.apply, less what Function.apply adds in Python (the binding for setup_context, the
# check for functorch transforms and dead wrappers), which has nothing to do on the route that
# calls it: plain tensors, outside transforms (cek.torch._apply). 1.5 microseconds a call on
# the 2-core CPU development machine.
eager = super(torch.autograd.Function, Eager).apply


def _setup_backward_context(ctx, inputs, output):
    grad, x1, x2, target, margin, reduction = inputs
    ctx.save_for_backward(grad, x1, x2, target)
    ctx.margin, ctx.reduction = margin, reduction


def _backward_of_backward(ctx, grad_dx1, grad_dx2):
    """The backward op's own gradient, for callers that differentiate it directly (the loss
    op's create_graph path does not come here): the composite gradient's vector-Jacobian
    product in grad, x1 and x2."""
    grad, x1, x2, target = ctx.saved_tensors
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (grad, x1, x2)]
        dx = _composite.gradients(*leaves, target, ctx.margin, ctx.reduction)
        result = torch.autograd.grad(dx, leaves, (grad_dx1, grad_dx2), allow_unused=True)
    return (*result, None, None, None)


backward_op.register_autograd(_backward_of_backward, setup_context=_setup_backward_context)
