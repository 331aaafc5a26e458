"""The element types the kernels take, and their NumPy views.

NumPy has no bfloat16, so a bf16 array is a uint16 array holding the bits (the same bits as a
torch.bfloat16 tensor viewed as int16). `to_float64` and `from_float` convert both ways, with
round-to-nearest-even like the kernels. `widen` and `from_float` take an array module `xp`
(NumPy by default, or CuPy), so that a benchmark converts on the device with the same code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # id suffix
    c_type: str  # C type of an element in the kernel
    array: np.dtype  # NumPy dtype of an array of it
    acc_c_type: str  # C type of sums, per-row values and scalars
    acc: np.dtype

    @property
    def vec(self) -> int:
        """Elements per 16-byte chunk."""
        return 16 // self.array.itemsize


DTYPES = {
    d.name: d
    for d in (
        DType("f32", "float", np.dtype(np.float32), "float", np.dtype(np.float32)),
        DType("f64", "double", np.dtype(np.float64), "double", np.dtype(np.float64)),
        DType("f16", "cek_f16", np.dtype(np.float16), "float", np.dtype(np.float32)),
        DType("bf16", "cek_bf16", np.dtype(np.uint16), "float", np.dtype(np.float32)),
    )
}


def name_of(array_dtype) -> str:
    """The kernels' name for a NumPy float dtype (bfloat16 has none in NumPy: it comes as bits)."""
    return {"float16": "f16", "float32": "f32", "float64": "f64"}[np.dtype(array_dtype).name]


def get(name: str) -> DType:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def to_float64(array: np.ndarray, dtype: str) -> np.ndarray:
    """Values of an array of `dtype` (bf16: its bits) as float64."""
    array = np.asarray(array)
    return (widen(array, dtype) if dtype == "bf16" else array).astype(np.float64)


def widen(array, dtype: str, xp=np):
    """Values of an array of `dtype` in at least float32 (bf16: its bits; float64 stays),
    on `xp`'s device: a bfloat16 is the top half of a float32."""
    if dtype == "bf16":
        bits = xp.asarray(array, xp.uint16).astype(xp.uint32)
        bits <<= xp.uint32(16)  # in place: a 0-d array stays an array, whose view exists
        return bits.view(xp.float32)
    if dtype == "f16":
        return array.astype(xp.float32)
    return array


def from_float(values, dtype: str, xp=np):
    """float values rounded to `dtype` (bf16: to its bits, nearest even; NaN stays NaN)."""
    if dtype != "bf16":
        return xp.asarray(values).astype(DTYPES[dtype].array)
    bits = xp.asarray(values, xp.float32).view(xp.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(xp.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return xp.where(nan, ((bits >> 16) | 0x40).astype(xp.uint16), rounded)


def smallest_step(dtype: str) -> float:
    """Spacing of the subnormals of `dtype`: below the smallest normal number a value is only
    as exact as this, whatever its size (float16: 2^-24 ~ 6e-8, next to 1e-5 gradients)."""
    return {"f16": 2.0**-24, "bf16": 2.0**-133, "f32": 2.0**-149, "f64": 0.0}[dtype]


def overflow_threshold(dtype: str) -> float:
    """Magnitudes from which a value rounds to infinity in `dtype` (float16: 65520)."""
    return 65520.0 if dtype == "f16" else np.inf


def nan_filled(shape, dtype: str, xp=np):
    return from_float(xp.full(shape, xp.nan, xp.float32), dtype, xp)


# -- float16 <-> float32 on the CPU, fast ------------------------------------------------------
# NumPy converts float16 element by element in software: ~2 ns an element each way, and over
# 50 ns for a result in float16's subnormal range (a float16 gradient of a mean is often there).
# These give the same bits with whole-array operations.

_U32 = np.uint32


@functools.lru_cache(maxsize=1)
def _half_table() -> np.ndarray:
    """Every float16 value, as float32, indexed by its bits (256 KiB)."""
    table = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    table.flags.writeable = False
    return table


def half_to_float(half: np.ndarray, out: np.ndarray) -> np.ndarray:
    """float16 `half` widened into float32 `out` of its shape (exact)."""
    return np.take(_half_table(), half.view(np.uint16), out=out)


def float_to_half(values: np.ndarray, out: np.ndarray, scratch: tuple) -> np.ndarray:
    """float32 `values` rounded to nearest even into float16 `out`, as NumPy's cast does (Inf
    and NaN kept, overflow to Inf). scratch: two uint32 arrays of the shape, overwritten."""
    bits = values.view(_U32)
    size, half = scratch
    np.bitwise_and(bits, _U32(0x7FFFFFFF), out=size)
    # Normal range: add 0xFFF plus the lowest kept bit (ties to even), drop 13 bits, rebias.
    np.right_shift(size, _U32(13), out=half)
    np.bitwise_and(half, _U32(1), out=half)
    half += size
    half += _U32((((15 - 127) << 23) + 0xFFF) & 0xFFFFFFFF)
    half >>= _U32(13)
    subnormal = size < _U32(113 << 23)  # below 2^-14: adding 0.5 lets the FPU round
    if subnormal.any():
        with np.errstate(invalid="ignore"):  # the NaNs among them are not used
            rounded = (size.view(np.float32) + np.float32(0.5)).view(_U32) - _U32(126 << 23)
        np.copyto(half, rounded, where=subnormal)
    overflow = size >= _U32(143 << 23)  # 2^16 and above (65520 up rounds there by itself)
    if overflow.any():
        special = np.where(size > _U32(0x7F800000), _U32(0x7E00), _U32(0x7C00))
        np.copyto(half, special, where=overflow)
    np.right_shift(bits, _U32(16), out=size)
    size &= _U32(0x8000)
    half |= size
    np.copyto(out.view(np.uint16), half, casting="unsafe")
    return out


# -- bfloat16 bits <-> float32 on the CPU, in place ----------------------------------------------
# widen and from_float above allocate several whole-array temporaries; cek.cpu converts a block
# of rows at a time into buffers it reuses, so its memory stays bounded.


def bfloat16_to_float(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    """bfloat16 `bits` (uint16) widened into float32 `out` of their shape (exact)."""
    # dtype: the shift runs in uint32 under every NumPy's promotion rules (NumPy 1.x shifted a
    # uint16 array by a uint32 scalar in uint16, losing every bit).
    np.left_shift(bits, _U32(16), out=out.view(_U32), dtype=_U32)
    return out


def float_to_bfloat16(values: np.ndarray, out: np.ndarray, scratch: tuple) -> np.ndarray:
    """float32 `values` rounded into bfloat16 bits `out` (uint16), as from_float rounds (nearest
    even, overflow to Inf, NaN stays NaN). scratch: two uint32 arrays of the shape, overwritten."""
    bits = values.view(_U32)
    rounded, nan = scratch
    np.right_shift(bits, _U32(16), out=rounded)
    rounded &= _U32(1)
    rounded += bits  # wraps modulo 2^32 exactly as from_float's sum does
    rounded += _U32(0x7FFF)
    rounded >>= _U32(16)
    np.bitwise_and(bits, _U32(0x7FFFFFFF), out=nan)
    where = nan > _U32(0x7F800000)
    if where.any():
        np.right_shift(bits, _U32(16), out=nan)
        nan |= _U32(0x40)
        np.copyto(rounded, nan, where=where)
    np.copyto(out, rounded, casting="unsafe")
    return out
