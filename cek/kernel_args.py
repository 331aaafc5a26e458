"""A kernel's arguments: their description (`Arg`), and what checking a launch's arguments needs
of them, worked out once a class and dtype (`Kernel.check_args` in cek.kernel uses it on every
launch): each argument's NumPy dtype, the positions of the sizes and shapes, a scalar as its C
type, an array's address."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cek import dtypes

if TYPE_CHECKING:
    from cek.kernel import Kernel


@dataclass(frozen=True)
class Arg:
    """One kernel argument: its name, its C type and, for a pointer, the shape it points to.

    `ctype` is "int", or written in the kernel's element type T and accumulation type A
    ("T*", "A*", "A"); `Kernel.c_type` and `Kernel.arg_dtype` resolve them for one dtype.
    `shape` names the int arguments that give each dimension, e.g. ("n_rows", "n_dim").
    An `optional` pointer may be None, which the kernel sees as nullptr. A `derived` pointer's
    shape is no product of int arguments (a workspace of the split kernels): the kernel class
    gives it (`Kernel.derived_shape`), and `shape` only names what it depends on. A pointer
    with a `stride` names the int argument that says how it is read: 1, an array of `shape`;
    0, one value read for every row (a mean's 0-d upstream gradient, read in place).
    """

    name: str
    ctype: str
    shape: tuple[str, ...] = ()
    output: bool = False
    optional: bool = False
    derived: bool = False
    stride: str | None = None
    align: int = 0  # bytes its address must be a multiple of, beyond its element's (0: none)

    @functools.cached_property  # asked several times per argument on every launch
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")


def address(array) -> int:
    """Where an array's data starts: a CuPy array's device pointer, a NumPy array's address."""
    pointer = getattr(getattr(array, "data", None), "ptr", None)
    return int(pointer) if pointer is not None else int(array.__array_interface__["data"][0])


_FLOAT_MAX = float(np.finfo(np.float32).max)


def c_scalar(c_type: type, value) -> Any:
    """`value` as the kernel's C type (a NumPy scalar type). A finite float beyond float32's
    range becomes an infinity of its sign, as the kernel's float arithmetic would make it,
    without NumPy's overflow warning (an exception under `-W error`)."""
    # Compared as a Python float: a NumPy float16 scalar would cast the bound to float16 (an
    # infinity, with the same warning) before comparing.
    if c_type is np.float32 and not -_FLOAT_MAX <= float(value) <= _FLOAT_MAX:
        with np.errstate(over="ignore"):
            return c_type(value)
    return c_type(value)


def _arg_dtype(dtype: str, arg: Arg) -> np.dtype:
    if arg.ctype == "int":
        return np.dtype(np.int32)
    d = dtypes.get(dtype)
    return d.array if arg.ctype.startswith("T") else d.acc


# check_args runs on every launch: what it needs of a class's `args` (a ClassVar) for one dtype
# is worked out once. Scalars: (position, name, is an int, C type); pointers: (position, Arg,
# dtype, which of the shapes, None for a derived one, the position of its stride argument or
# None); shapes: the positions of the int arguments giving each distinct shape (the kernels
# have two: [N, D] and [N]).
@functools.lru_cache(maxsize=None)
def _arg_plan(kernel_class: type[Kernel], dtype: str) -> tuple[tuple, tuple, tuple]:
    args = kernel_class.args
    at = {spec.name: i for i, spec in enumerate(args)}
    scalars = tuple((i, spec.name, spec.ctype == "int", _arg_dtype(dtype, spec).type)
                    for i, spec in enumerate(args) if not spec.is_pointer)
    shapes = tuple(dict.fromkeys(tuple(at[s] for s in spec.shape) for spec in args
                                 if spec.is_pointer and not spec.derived))
    pointers = tuple((i, spec, _arg_dtype(dtype, spec),
                      None if spec.derived else shapes.index(tuple(at[s] for s in spec.shape)),
                      None if spec.stride is None else at[spec.stride])
                     for i, spec in enumerate(args) if spec.is_pointer)
    return scalars, pointers, shapes


@functools.lru_cache(maxsize=None)
def _size_positions(kernel_class: type[Kernel]) -> tuple[int, int]:
    names = [spec.name for spec in kernel_class.args]
    return names.index("n_rows"), names.index("n_dim")
