"""Checks on user input for the functional API and the PyTorch wrapper, done before any launch.

Every check raises ValueError (a bad value or shape) or TypeError (a bad type, dtype, array kind
or device) with the offending value in the message. Nothing here writes to an array, so a
caller's `out` buffers stay untouched when a check fails.

Array kinds are told apart without importing CuPy: a CuPy array can only exist once `cupy` is in
`sys.modules`, and `import cek` on a CPU-only machine should not pay for loading CuPy.
"""

from __future__ import annotations

import math
import numbers
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

REDUCTIONS = ("none", "mean", "sum")
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class Problem:
    """What the checks learned about a call: enough to run it without looking again."""

    kind: str  # "numpy" or "cupy"
    dtype: np.dtype  # of x1 and x2
    n_rows: int
    n_dim: int
    batched: bool  # False for (D,) inputs with a 0-d target: results are squeezed
    device: int | None  # CuPy device id, None for NumPy
    margin: float
    reduction: str

    @property
    def loss_shape(self) -> tuple[int, ...]:
        if self.reduction != "none":
            return ()
        return (self.n_rows,) if self.batched else ()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.n_rows, self.n_dim) if self.batched else (self.n_dim,)

    @property
    def grad_shape(self) -> tuple[int, ...]:
        """Shape of the upstream gradient: that of the loss."""
        return self.loss_shape


def array_kind(value: Any) -> str | None:
    """"numpy", "cupy", or None for anything else. A NumPy scalar (such as y[0]) counts as a
    0-d NumPy array."""
    if isinstance(value, (np.ndarray, np.generic)):
        return "numpy"
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(value, cupy.ndarray):
        return "cupy"
    return None


def _shown(value: Any) -> str:
    """repr(value), shortened for an int of hundreds of digits."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:12]}...{text[-4:]} ({len(text)} characters)"


def check_reduction(reduction: Any) -> str:
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    return reduction


def check_margin(margin: Any) -> float:
    if isinstance(margin, (bool, np.bool_)) or not isinstance(margin, numbers.Real):
        raise TypeError(f"margin must be a real number, got {type(margin).__name__} {margin!r}")
    try:
        value = float(margin)
    except OverflowError:  # an int beyond float's range, such as 2**2000
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"margin must be finite, got {_shown(margin)}")
    return value


def check_shapes(x1_shape, x2_shape, target_shape, names=("x1", "x2")) -> tuple[int, int, bool]:
    """(n_rows, n_dim, batched) for torch's shapes: (N, D) with (N,), or (D,) with ()."""
    x1_shape, x2_shape, target_shape = tuple(x1_shape), tuple(x2_shape), tuple(target_shape)
    both = " and ".join(names)
    if x1_shape != x2_shape:
        raise ValueError(f"{both} must have the same shape, got {x1_shape} and {x2_shape}")
    if len(x1_shape) not in (1, 2):
        raise ValueError(f"{both} must be (N, D) or (D,), got {len(x1_shape)} dims: {x1_shape}")
    batched = len(x1_shape) == 2
    n_rows, n_dim = x1_shape if batched else (1, x1_shape[0])
    want = (n_rows,) if batched else ()
    if target_shape != want:
        raise ValueError(f"target must have shape {want} for inputs {x1_shape}, got {target_shape}")
    if n_dim == 0:
        raise ValueError(f"D must be at least 1 (an empty row has no cosine), got {x1_shape}")
    return int(n_rows), int(n_dim), batched


def check_float_dtypes(x1_dtype, x2_dtype) -> np.dtype:
    """The common dtype of x1 and x2: float16, float32 or float64, and the same for both."""
    for name, dtype in (("x1", x1_dtype), ("x2", x2_dtype)):
        if np.dtype(dtype) not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16, float32 or float64, got {dtype}")
    if np.dtype(x1_dtype) != np.dtype(x2_dtype):
        raise TypeError(f"x1 and x2 must have the same dtype, got {x1_dtype} and {x2_dtype}")
    return np.dtype(x1_dtype)


def check_label_dtype(dtype, name: str = "target") -> None:
    """Labels may be any real dtype (float or int, as torch accepts); not bool, not complex."""
    kind = np.dtype(dtype).kind
    if kind not in "fiu":
        raise TypeError(f"{name} must have a real float or int dtype, got {dtype}")


def refuse_tensor(name: str, value: Any) -> None:
    """TypeError for a torch.Tensor, naming cek.torch, which takes tensors. Like a CuPy array, a
    tensor can only exist once `torch` is in `sys.modules`: torch is never imported here."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        raise TypeError(f"{name} is a torch.Tensor: for tensors use "
                        "cek.torch.cosine_embedding_loss (autograd gives the gradients); these "
                        "functions take numpy.ndarray or cupy.ndarray")


def _same_kind(kind: str, name: str, value: Any) -> None:
    refuse_tensor(name, value)
    if isinstance(value, np.ma.MaskedArray):
        raise TypeError(f"{name} is a numpy.ma.MaskedArray: its mask would be ignored; pass "
                        f"{name}.filled(value) or select the unmasked rows")
    got = array_kind(value)
    if got != kind:
        what = got or type(value).__module__ + "." + type(value).__name__
        raise TypeError(f"{name} must be a {kind} array like x1, got {what}")


def _device_of(value: Any) -> int | None:
    return value.device.id if array_kind(value) == "cupy" else None


def _check_device(device: int | None, name: str, value: Any) -> None:
    if _device_of(value) != device:
        raise TypeError(f"{name} is on GPU {_device_of(value)}, but x1 is on GPU {device}")


def check_inputs(x1, x2, target, margin, reduction) -> Problem:
    """Check the arguments every entry point shares; return the Problem they describe."""
    kind = array_kind(x1)
    if kind is not None:
        _same_kind(kind, "x1", x1)  # refuses a masked array
    if kind is None:
        refuse_tensor("x1", x1)
        raise TypeError(f"x1 must be a numpy.ndarray or cupy.ndarray, got {type(x1).__name__}")
    _same_kind(kind, "x2", x2)
    _same_kind(kind, "target", target)
    device = _device_of(x1)
    _check_device(device, "x2", x2)
    _check_device(device, "target", target)
    dtype = check_float_dtypes(x1.dtype, x2.dtype)
    check_label_dtype(target.dtype)
    n_rows, n_dim, batched = check_shapes(x1.shape, x2.shape, target.shape)
    return Problem(
        kind=kind,
        dtype=dtype,
        n_rows=n_rows,
        n_dim=n_dim,
        batched=batched,
        device=device,
        margin=check_margin(margin),
        reduction=check_reduction(reduction),
    )


def check_gpu_problem(n_rows: int, n_dim: int, max_n_dim: int, blocks_per_row: int = 1) -> None:
    """What the GPU kernels take: rows of at most max_n_dim elements, a row count that fits their
    `int n_rows`, and a grid of n_rows * blocks_per_row blocks in the grid's x dimension."""
    if n_dim > max_n_dim:
        raise ValueError(f"the GPU kernels take D up to {max_n_dim} in this dtype, got D = {n_dim}")
    if n_rows >= 2**31:
        raise ValueError(f"the GPU kernels take fewer than 2**31 rows, got N = {n_rows}")
    if n_rows * blocks_per_row >= 2**31:
        raise ValueError(f"N = {n_rows} rows of D = {n_dim} take {blocks_per_row} blocks a row, "
                         f"{n_rows * blocks_per_row} in all, more than a launch has (2**31 - 1): "
                         f"pass fewer rows a call")


def first_bad_label(target) -> tuple[int, float] | None:
    """(row, value) of the first label that is neither 1 nor -1, or None. NaN counts as bad.

    On a CuPy array this reads one bool and, when there is a bad label, one index back to the
    host: the only synchronisation validate_target=True adds.
    """
    flat = target.reshape(-1)
    bad = ~((flat == 1) | (flat == -1))
    if flat.size == 0 or not bool(bad.any()):
        return None
    row = int(bad.argmax())
    return row, float(flat[row])


def check_labels(target, batched: bool) -> None:
    """ValueError naming the first label that is neither 1 nor -1 (validate_target=True)."""
    found = first_bad_label(target)
    if found is None:
        return
    row, value = found
    where = f"target[{row}]" if batched else "target"
    raise ValueError(f"{where} = {value!r}: labels must be 1 or -1 (validate_target=True)")


def check_grad(grad, problem: Problem, name: str = "grad"):
    """The upstream gradient: a real number or 0-d array for mean and sum, an array shaped like
    the per-row loss for none. Returns it unchanged."""
    shape = problem.grad_shape
    if isinstance(grad, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number or an array, got {grad!r}")
    if isinstance(grad, numbers.Real) and not isinstance(grad, np.ndarray):
        try:
            float(grad)
        except OverflowError:
            raise ValueError(f"{name} must fit a float, got {_shown(grad)}") from None
        if shape != ():
            raise ValueError(
                f"{name} must be an array of shape {shape} for reduction='none', got {grad!r}"
            )
        return grad
    _same_kind(problem.kind, name, grad)
    _check_device(problem.device, name, grad)
    check_label_dtype(grad.dtype, name)
    if tuple(grad.shape) != shape:
        raise ValueError(
            f"{name} must have shape {shape} for reduction={problem.reduction!r}, got {grad.shape}"
        )
    return grad


def check_out(out, problem: Problem, shapes: tuple[tuple[int, ...], ...], names: tuple[str, ...]):
    """Caller buffers: a single array when one result is wanted, else a tuple or list of them,
    each of the problem's kind, device and dtype, of its result's shape, and writeable.
    Returns them as a tuple (or None)."""
    if out is None:
        return None
    if len(shapes) == 1:
        buffers = (out,)
    else:
        if not isinstance(out, (tuple, list)) or len(out) != len(shapes):
            raise TypeError(
                f"out must be a tuple of {len(shapes)} arrays ({', '.join(names)}), "
                f"got {type(out).__name__}"
            )
        buffers = tuple(out)
    for name, shape, buffer in zip(names, shapes, buffers):
        _same_kind(problem.kind, name, buffer)
        _check_device(problem.device, name, buffer)
        if buffer.dtype != problem.dtype:
            raise TypeError(f"{name} must have dtype {problem.dtype} like x1, got {buffer.dtype}")
        if tuple(buffer.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {buffer.shape}")
        if problem.kind == "numpy" and not buffer.flags.writeable:
            raise ValueError(f"{name} is read-only")
    # Two results in one memory would each be half overwritten (on a GPU the kernel's stores
    # are __restrict__ and may land in either order).
    xp = np if problem.kind == "numpy" else sys.modules["cupy"]
    for i in range(len(buffers)):
        for j in range(i + 1, len(buffers)):
            if buffers[i].size and buffers[j].size and xp.may_share_memory(buffers[i], buffers[j]):
                raise ValueError(f"{names[i]} and {names[j]} share memory")
    return buffers
