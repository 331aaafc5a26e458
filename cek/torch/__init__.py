"""PyTorch front end: `cosine_embedding_loss` and `CosineEmbeddingLoss`, drop-in for torch's.

Needs PyTorch (`pip install torch`, or `pip install '.[torch]'` from a checkout); `import cek`
does not import torch, only `import cek.torch`.

The work runs in two custom ops (cek/torch/_ops.py), so torch.compile(fullgraph=True),
torch.export and fake tensors see cek as one op each way. Inputs follow torch's rules: x1 and x2
are promoted to their common float dtype (the loss comes back in it), labels of any dtype are
read as torch compares them, margins are what torch takes (NaN and infinities included), rows
broadcast ((1, D) against (N, D), a (1,) target against N rows), and D = 0 gives torch's
values.

CUDA tensors go to the GPU kernels without a copy (DLPack), on the tensor's device and
`torch.cuda.current_stream()` there, never reading a value back to the host. In eager mode,
when autograd will want the gradients, the forward runs the fused kernel (reads x1, x2 once;
writes the loss and the gradients for an upstream gradient of 1) and holds those two N x D
gradients until the backward, whose keep kernel leaves the rows whose upstream gradient is that
one as they are and recomputes the others from x1 and x2. Otherwise (no_grad, no input that
requires grad) the forward runs the forward kernel alone; compiled code runs the ops, the
forward kernel then the backward kernel (cek/torch/_ops.py). Every dtype has its own kernel:
float16 and bfloat16 read half the bytes of float32, and all but float64 accumulate in float32.
A few wide rows (fewer than 512 of more than 16384 elements, 8192 in float64) and rows wider
than 2**20 run split across blocks, two launches a kernel (cek.cosine_embedding_loss_split), on
a workspace from torch's caching allocator; rows wider than 2**22 elements (2**23 in float16
and bfloat16, 2**21 in float64) have no GPU kernel (ValueError).
Whether CuPy sees a GPU is asked when the ops run, not here: the code before them is what
torch.compile traces, and CuPy's calls cannot be traced.

CPU tensors go through cek.functional's NumPy path: float16 and float32 are accumulated in
float32, float64 in float64, bfloat16 (which NumPy lacks) is computed in float32 and cast back.

With create_graph=True, under torch.func transforms (vmap, jvp, grad), inside a forward-mode AD
dual level, for D = 0, for a NaN or infinite margin and on devices other than CPU and CUDA,
the same semantics run as torch operations (cek/torch/_composite.py), which autograd and the
transforms can see through.

Under torch.autocast, float16 and bfloat16 inputs are cast to float32 and the loss comes out
float32, as torch's own autocast policy does for cosine_embedding_loss.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.autograd import forward_ad
from torch.utils._python_dispatch import _get_current_dispatch_mode as _dispatch_mode

from cek import validate
from cek.torch import _composite, _ops

__all__ = ["CosineEmbeddingLoss", "ShapeError", "cosine_embedding_loss"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_HALVES = (torch.float16, torch.bfloat16)


class ShapeError(ValueError, RuntimeError):
    """Inputs of shapes this loss does not take. A ValueError, as cek's checks raise for a bad
    value, and a RuntimeError, as torch raises for these shapes: code written against either
    catches it. The messages start as torch's do."""


def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None,
                          reduction="mean"):
    """torch.nn.functional.cosine_embedding_loss, computed by cek (see the module docstring)."""
    if size_average is not None or reduce is not None:
        reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
    for name, value in (("input1", input1), ("input2", input2), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if type(margin) is not float and isinstance(margin, torch.Tensor) \
            and torch.compiler.is_compiling():  # (a float first: isinstance on Tensor is slow)
        return _tensor_margin(input1, input2, target, margin, reduction)
    return _loss(input1, input2, target, margin, reduction)


def _loss(input1, input2, target, margin, reduction):
    """The loss of checked tensors (the public function's arguments past its first checks)."""
    device_type = input1.device.type
    autocast = device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type)
    if autocast:
        # torch's autocast runs this loss in float32 (and leaves float64 alone); casting each
        # input on its own also accepts the mixed float32/bfloat16 pairs autocast produces.
        input1, input2 = (t.float() if t.dtype in _HALVES else t for t in (input1, input2))
    keep = torch.is_grad_enabled() and (input1.requires_grad or input2.requires_grad)
    input1, input2, target, margin, reduction, fuse = _check(input1, input2, target, margin,
                                                             reduction, keep)
    if autocast:
        with torch.autocast(device_type=device_type, enabled=False):
            return _apply(input1, input2, target, margin, reduction, device_type, fuse)
    return _apply(input1, input2, target, margin, reduction, device_type, fuse)


# A tensor margin's value is read on the host, which torch.compile cannot trace: torch's own
# loss breaks the graph at that read and runs uncompiled; so does cek's, as one call. Not
# torch.compiler.disable, which imports torch._dynamo (a second of import time, and dynamo's
# table of torch's functions, which cek.torch.patch() must see built before it patches): this
# wrapper imports it at its first call, which comes from a compiling frame, where it is loaded.
# It runs `_loss`, not the public function: under a non-strict torch.export the process stays
# "compiling" inside it, and the public function would hand the call back here without end.
_tensor_margin = torch._disable_dynamo(_loss)


class CosineEmbeddingLoss(torch.nn.Module):
    """torch.nn.CosineEmbeddingLoss, computed by cek."""

    def __init__(self, margin=0.0, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = torch.nn._reduction.legacy_get_string(size_average, reduce)
        _margin(margin)  # what torch would refuse at the first call is refused here
        _reduction(reduction, warn=False)
        self.margin, self.reduction = margin, reduction  # as torch's module keeps them

    def forward(self, input1, input2, target):
        return cosine_embedding_loss(input1, input2, target, self.margin, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, reduction={self.reduction!r}"


def _apply(input1, input2, target, margin, reduction, device_type, fuse):
    """The composite torch formula, the eager autograd.Function or the custom op. The three
    tensors are on one device (_check), of type `device_type`; `fuse`: _fuses said the eager
    route runs the fused kernel."""
    if _composite_route(device_type, input1, input2, target):
        return _composite.loss(input1, input2, target, margin, reduction)
    if torch.compiler.is_compiling():
        return _ops.loss_op(input1, input2, target, margin, reduction)
    if _plain_eager(device_type, input1, input2, target):
        return _ops.eager(input1, input2, target, margin, reduction, fuse)
    return _ops.loss_op(input1, input2, target, margin, reduction)


def _composite_route(device_type, input1, input2, target) -> bool:
    """Devices without kernels, D = 0, and (outside torch.compile) torch.func transforms."""
    if device_type not in ("cpu", "cuda", "meta") or input1.shape[-1] == 0:
        return True
    return not torch.compiler.is_compiling() and _transformed(input1, input2, target)


def _fuses(input1, input2, target, margin, keep) -> bool:
    """Whether the call runs the eager route's fused kernel (CUDA inputs whose gradients
    autograd will want, a finite margin, plain tensors outside torch.compile and transforms),
    which writes the copy of the labels its backward reads (cek/torch/_ops.py, Eager)."""
    return (keep and input1.is_cuda and not torch.compiler.is_compiling()
            and math.isfinite(margin)  # (a concrete float: not compiling)
            and not _composite_route("cuda", input1, input2, target)
            and _plain_eager("cuda", input1, input2, target))


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain_eager(device_type, *tensors) -> bool:
    """Plain CPU or CUDA tensors outside torch.compile, where the ops' dispatch is only a cost.
    Under export, make_fx, fake or meta tensors and tensor subclasses the custom ops run, so
    what traces sees is the op with its fake implementation."""
    return (device_type != "meta" and _dispatch_mode() is None
            and all(type(t) in _PLAIN for t in tensors))


def _transformed(*tensors) -> bool:  # input1, input2, target
    """Inside torch.func transforms or a forward-mode dual level: the ops have no rules there."""
    if forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active():
        return True
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor  # (a dead wrapper too)
    return wrapped(tensors[0]) or wrapped(tensors[1]) or wrapped(tensors[2])


def _check(input1, input2, target, margin, reduction, keep):
    """Every check on tensors, before any work, torch's promotion of integer and bool inputs,
    its broadcasting and its reading of the labels: (input1, input2, labels, margin as float,
    reduction, whether the eager fused kernel runs: _fuses). Float inputs of two dtypes stay as
    they are: the ops convert them, so that autograd saves the caller's tensors
    (_ops._promoted). `keep`: a backward will read the labels (_labels), which then are a copy
    of the caller's: made here, or by the fused kernel as it reads them. What the tensors'
    checks decide depends only on their dtypes, shapes and
    devices (and torch's default dtype, for integer inputs): it is worked out in full for the
    first call of each and found after that (_plan), as a training loop passes the same few
    step after step. Not under torch.compile, which turns the checks into guards of its own and
    would guard on the memo too."""
    if torch.compiler.is_compiling():
        plan = _plan(input1, input2, target)
    else:
        key = (input1.dtype, input2.dtype, target.dtype, input1.shape, input2.shape,
               target.shape, input1.device, input2.device, target.device, input1.is_cuda,
               torch.get_default_dtype())
        plan = _plans.get(key)
        if plan is None:
            plan = _plan(input1, input2, target)
            if len(_plans) >= _MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    margin = margin if type(margin) is float else _margin(margin)  # (symbolic when compiled)
    reduction = _reduction(reduction)
    dtype, shape, rows, expand = plan
    if input1.dtype not in _FLOATS:
        input1 = input1.to(dtype)
    if input2.dtype not in _FLOATS:
        input2 = input2.to(dtype)
    if expand:
        input1, input2 = input1.expand(shape), input2.expand(shape)
    fuse = _fuses(input1, input2, target, margin, keep) if keep else False
    target = _labels(target, dtype, keep and not fuse)
    if expand:
        target = target.expand(rows)
    return input1, input2, target, margin, reduction, fuse


def _margin(margin):
    """The margin as a float, taking what torch's loss takes: a Python or NumPy real number
    (bool included; NaN and the infinities too, which torch computes with), or a 0-d tensor
    that does not require grad. A tensor's value is read on the host, so it must be a CPU
    tensor here: reading a CUDA one would wait for the device on every call (torch does)."""
    if isinstance(margin, torch.Tensor):
        if margin.dim() != 0 or margin.requires_grad:
            raise TypeError(f"margin must be a float or a 0-d tensor that does not require "
                            f"grad, got a tensor of shape {tuple(margin.shape)}"
                            f"{' that requires grad' if margin.requires_grad else ''}")
        if margin.device.type != "cpu":
            raise TypeError(f"a tensor margin must be on the CPU, got one on {margin.device}: "
                            f"its value is read on the host, which waits for the device")
        return float(margin)
    if not isinstance(margin, (int, float, np.integer, np.floating, np.bool_, torch.SymInt,
                               torch.SymFloat)):
        if torch.compiler.is_compiling():  # where dynamo shows a NumPy number as a 0-d array
            if isinstance(margin, np.ndarray) and margin.ndim == 0:
                return torch.sym_float(margin)  # its value specialises, as for torch's loss
            raise TypeError(f"margin must be a float, got {type(margin).__name__}")
        raise TypeError(f"margin must be a float, got {type(margin).__name__} {margin!r}")
    return torch.sym_float(margin)  # an int beyond float's range: OverflowError, as in torch


def _reduction(reduction, warn=True):
    """The reduction's name; torch's old "elementwise_mean" is "mean", with torch's warning."""
    if reduction == "elementwise_mean":
        if warn:
            torch.nn._reduction.get_enum(reduction)
        return "mean"
    return validate.check_reduction(reduction)


_SIGNED = {torch.uint8: torch.int8, torch.uint16: torch.int16, torch.uint32: torch.int32,
           torch.uint64: torch.int64}


def _labels(target, dtype, copy):
    """The labels as cek reads them: a row is label 1 or -1 exactly where torch's loss finds it
    so, comparing `target == 1` and `target == -1` in the target's own dtype (where -1 is the
    largest value of an unsigned type, 255 in uint8, and no bool equals -1). They come in the
    inputs' accumulation dtype (float32, or float64 for float64 inputs), which the kernels read.
    `copy`: a backward will read them and no kernel copies them first. They are then never the
    caller's tensor, as torch's backward saves its comparisons, not the target: a label buffer
    refilled in place before the backward, or labels made under torch.inference_mode (which
    autograd cannot save), work."""
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if target.dtype == acc:
        return target.clone(memory_format=torch.contiguous_format) if copy else target
    if target.dtype == torch.float64 or target.is_complex():  # float32 could round 1 + 1e-12
        # to label 1; a complex label is +-1 only with no imaginary part
        return torch.where(target == 1, 1.0, torch.where(target == -1, -1.0, 0.0)).to(acc)
    if target.dtype in _SIGNED:
        target = target.view(_SIGNED[target.dtype])
    return target.to(acc)  # exact for every +-1 (bool: 1 or 0)


_plans: dict[tuple, tuple] = {}
_MAX_PLANS = 1024  # a loop passes a few signatures; a bound for one whose shapes keep changing


def _plan(input1, input2, target):
    """The checks on the tensors (errors as torch's, or cek's where torch has none), and what
    they decide: (the dtype both inputs take, their broadcast shape, the target's, whether any
    of the three is broadcast)."""
    for name, value in (("input1", input1), ("input2", input2)):
        if value.is_complex():
            raise TypeError(f"{name} must have a real or bool dtype, got {value.dtype}")
    device = input1.device
    for name, value in (("input2", input2), ("target", target)):
        if value.device != device:
            raise TypeError(f"{name} is on {value.device}, but input1 is on {device}")
    shape1, shape2, shape_t = tuple(input1.shape), tuple(input2.shape), tuple(target.shape)
    if target.dim() > 1:
        raise ShapeError(f"0D or 1D target tensor expected, multi-target not supported, got "
                         f"target {shape_t}")
    dims = 2 if target.dim() == 1 else 1
    if input1.dim() != dims or input2.dim() != dims:
        wanted = "1D target tensor expects 2D input tensors" if dims == 2 else \
            "0D target tensor expects 1D input tensors"
        raise ShapeError(f"{wanted}, but found inputs with sizes {list(shape1)} and "
                         f"{list(shape2)} ({input1.dim()} and {input2.dim()} dims, target "
                         f"{shape_t})")
    # Where torch's broadcasting fails, its message first (input1 * input2 fails at the last
    # dimension before the first; then the target against the rows of the cosine).
    width1, width2 = shape1[-1], shape2[-1]
    if width1 != width2 and 1 not in (width1, width2):
        raise ShapeError(f"The size of tensor a ({width1}) must match the size of tensor b "
                         f"({width2}) at non-singleton dimension {dims - 1}: the width D of "
                         f"input1 {shape1} and input2 {shape2} differ")
    rows = (_row_count(shape1[0], shape2[0], shape_t[0], (shape1, shape2, shape_t)),) \
        if dims == 2 else ()
    if width1 != width2:  # torch would broadcast D too, but then each norm runs over its own
        raise ShapeError(  # width: a different loss, not cek's (docs/torch.md)
            f"the width D of input1 ({width1}) must match the size of input2's ({width2}): "
            f"got {shape1} and {shape2}")
    # torch's result dtype: each squared norm plus the float EPS is in its input's float dtype
    # (the default dtype for an integer or bool input), and the cosine promotes the two.
    dtype = torch.promote_types(*(t.dtype if t.dtype in _FLOATS else torch.get_default_dtype()
                                  for t in (input1, input2)))
    shape = (*rows, shape1[-1])
    expand = shape1 != shape or shape2 != shape or shape_t != rows
    return dtype, shape, rows, expand


def _row_count(n1, n2, n_target, shapes):
    """N, the rows of torch's broadcasting of the counts of input1, input2 and the target (each
    must be N or 1), or torch's error: input1 * input2 fails first, then the target against
    their rows. Only comparisons, as torch's broadcasting makes, so that a symbolic N under
    torch.compile and torch.export stays symbolic (a set of the counts would hash it)."""
    rows = n2 if n1 == 1 else n1
    if n2 != 1 and n2 != rows:
        a, b = n1, n2
    elif n_target != 1 and rows != 1 and n_target != rows:
        a, b = n_target, rows
    else:
        return n_target if rows == 1 else rows
    raise ShapeError(f"The size of tensor a ({a}) must match the size of tensor b ({b}) at "
                     f"non-singleton dimension 0: the rows of input1 {shapes[0]}, input2 "
                     f"{shapes[1]} and target {shapes[2]} do not broadcast (each count must be "
                     f"N or 1)")


# cek in place of torch's function, for code that calls torch's (cek/torch/_patch.py)
from cek.torch._patch import patch, patched, unpatch  # noqa: E402

__all__ += ["patch", "patched", "unpatch"]
