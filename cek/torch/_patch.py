"""cek in place of torch.nn.functional.cosine_embedding_loss: `patch()`, `unpatch()` and
`with patched():`.

The attribute on torch.nn.functional is what is replaced. torch.nn.CosineEmbeddingLoss looks it
up there at every call (torch.nn.modules.loss calls `F.cosine_embedding_loss` through the
module), and so does any library that calls the function by its module, so they all run cek
with no edit. A name bound before the patch (`from torch.nn.functional import
cosine_embedding_loss`) keeps torch's function: it is not reached.

patch() is idempotent: patching twice is patching once, and one unpatch() puts back the very
object that was there before the first patch. patched() leaves things as it found them: inside
an outer patched() or after a patch(), its exit does not unpatch.

What cek does not serve runs torch's own function, so the result or the error is torch's:
inputs that are not plain tensors of a CPU or CUDA device (tensor subclasses and modes that
override torch functions, which torch's function hands on to them), and any call cek refuses.
cek checks everything before it starts any work (cek.torch), so a call it refuses has done
nothing, and torch's function then runs it afresh: torch's error for what torch refuses too,
torch's result for what it takes and cek does not (widths of which one is 1, a CUDA tensor as
the margin, more than cek's GPU kernels take). cek's errors about where it runs are raised as
they are (_OWN): no CuPy or no device, a kernel that does not compile, a first launch under
CUDA-graph capture, the device's memory exhausted. Handed to torch, they would leave a caller
who patched cek in running torch's loss without a word, or capturing it in a CUDA graph.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

import cek.torch as ct
from cek import gpu
from cek.compile import CompileError

__all__ = ["patch", "patched", "unpatch"]

_DEVICES = ("cpu", "cuda")
_has_torch_function = torch.overrides.has_torch_function_variadic
_original = None  # torch's function (whatever was there at patch()), while patched
# cek's errors about where it runs, not about the call's inputs: raised, not handed to torch
_OWN = (gpu.NoDeviceError, gpu.CaptureError, CompileError, torch.OutOfMemoryError)


def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None,
                          reduction="mean"):
    """torch.nn.functional.cosine_embedding_loss computed by cek where cek serves the call,
    torch's own function where it does not (the module docstring)."""
    args = (input1, input2, target, margin, size_average, reduce, reduction)
    if not _served(input1, input2, target):
        return _original(*args)
    try:
        return ct.cosine_embedding_loss(*args)
    except _OWN:
        raise
    except Exception:  # noqa: BLE001 - refused before any work: torch's result or error
        return _original(*args)


def _served(input1, input2, target) -> bool:
    """Tensors cek takes as they are: no __torch_function__ override of a subclass or a mode
    (torch's function hands the call to those), on a device cek has kernels for."""
    return (isinstance(input1, torch.Tensor) and isinstance(input2, torch.Tensor)
            and isinstance(target, torch.Tensor)
            and not _has_torch_function(input1, input2, target)
            and input1.device.type in _DEVICES)


def patch() -> None:
    """Put cek's function in place of torch.nn.functional.cosine_embedding_loss (again: no
    change)."""
    global _original
    if F.cosine_embedding_loss is not cosine_embedding_loss:
        _dynamo_reads_torchs_function()
        _original = F.cosine_embedding_loss
        F.cosine_embedding_loss = cosine_embedding_loss


def _dynamo_reads_torchs_function() -> None:
    """torch.compile's table of torch's own functions, which it puts in a graph without
    tracing them, is built once, from the attributes of torch's modules when torch._dynamo is
    first imported. Built while patched, it would take cek's function for torch's and put the
    call in the graph untraced, so torch.compile would not see the custom ops cek picks for
    it (cek.torch). Built first, it holds torch's function, and cek's is traced as cek.torch's
    own is. The first import of torch._dynamo costs about a second."""
    from torch._dynamo import trace_rules

    trace_rules.get_torch_obj_rule_map()


def unpatch() -> None:
    """Put back the function patch() replaced, the very object (when not patched: no change)."""
    if F.cosine_embedding_loss is cosine_embedding_loss:
        F.cosine_embedding_loss = _original


def is_patched() -> bool:
    return F.cosine_embedding_loss is cosine_embedding_loss


@contextlib.contextmanager
def patched():
    """cek in torch's place inside the block; on exit, as it was before the block."""
    was = is_patched()
    patch()
    try:
        yield
    finally:
        if not was:
            unpatch()
