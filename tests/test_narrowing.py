"""emulator tier: float -> float16 / bfloat16, both paths of kernels/cek_types.cuh, bit for bit.

From sm_80 on the kernels round two values with one `cvt.rn.f16x2.f32` / `cvt.rn.bf16x2.f32`;
below, float16 takes one `cvt.rn.f16.f32` a value and bfloat16 an integer rounding. The emulator
builds either (CEK_PACKED_CVT 1 or 0; the instructions modelled by their definition), and both
must give the bits `cvt.rn` defines: round to nearest, ties to even, subnormals kept, infinity
past the largest finite value, NaN as 0x7fff. The inputs are every float32 next to a rounding
boundary of every 16-bit value: each value, the tie halfway to the next and the floats either
side of both, in both signs, and the specials.
"""

import numpy as np
import pytest

from cek.kernel import Arg, Kernel
from cek.sources import load_kernel_source

emulate = pytest.importorskip("cek.emulate")

pytestmark = pytest.mark.emulator

NAN_16 = 0x7FFF  # the canonical NaN cvt.rn writes, both formats
SPECIALS = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                     0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7FA00000, 0x00000001, 0x807FFFFF,
                     0x7F7FFFFF, 0xFF7FFFFF], np.uint32)


class _Narrow(Kernel):
    """narrowed[i] = CekType<T>::from_acc2(f[2i], f[2i+1]), with CEK_PACKED_CVT = `packed`."""

    name = "cek_narrow_probe"
    kind = "probe"
    packed = 1
    args = (Arg("f", "float*", ("n",)), Arg("narrowed", "float*", ("n_half",), output=True),
            Arg("n", "int"), Arg("n_half", "int"))

    @property
    def kernel_source(self) -> str:
        return f"#define CEK_PACKED_CVT {self.packed}\n" + load_kernel_source("cek_types.cuh") + """
template <int BLOCK_SIZE, typename T>
__device__ void cek_narrow_probe(const float* f, float* narrowed, int n, int n_half) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n_half)
        narrowed[i] = cek_float_from_bits(CekType<T>::from_acc2(f[2 * i], f[2 * i + 1]));
}
"""


class _NarrowOneAtATime(_Narrow):
    packed = 0


def _narrow(dtype: str, packed: bool, bits: np.ndarray) -> np.ndarray:
    """The 16-bit results of rounding the float32 values of `bits` on the emulator."""
    f = np.asarray(bits, np.uint32)
    f = np.append(f, np.uint32(0)) if f.size % 2 else f
    f = f.view(np.float32)
    out = np.full(f.size // 2, np.nan, np.float32)
    kernel = (_Narrow if packed else _NarrowOneAtATime)(256, dtype)
    emulate.load(kernel)((-(-out.size // 256),), (256,), (f, out, f.size, out.size))
    words = out.view(np.uint32)
    pairs = np.stack([words & 0xFFFF, words >> 16], axis=1).reshape(-1).astype(np.uint16)
    return pairs[:len(bits)]


def _near_boundaries(dtype: str) -> np.ndarray:
    """float32 bits of every 16-bit value and of the tie between it and the next larger one,
    each with its two neighbouring floats, in both signs, and SPECIALS. The largest finite
    value's next is the first it rounds to infinity from (float16: 65536, bfloat16: 2^128)."""
    if dtype == "f16":
        finite = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
        values = np.append(finite, 65536.0)
        ties = (values[:-1] + values[1:]) / 2  # exact in float32: 12 significant bits
        points = np.concatenate([values[:-1], ties]).astype(np.float32).view(np.uint32)
    else:
        values = np.arange(0x7F80, dtype=np.uint32) << 16
        points = np.concatenate([values, values | 0x8000])  # the tie: half of the dropped bits
    points = points.astype(np.int64)
    near = np.concatenate([points - 1, points, points + 1])
    near = near[(near >= 0) & (near <= 0x7F800000)].astype(np.uint32)
    return np.concatenate([near, near | 0x80000000, SPECIALS])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_both_paths_give_the_same_bits(dtype):
    bits = _near_boundaries(dtype)
    packed, one_at_a_time = _narrow(dtype, True, bits), _narrow(dtype, False, bits)
    differ = np.flatnonzero(packed != one_at_a_time)
    assert differ.size == 0, [(hex(bits[i]), hex(packed[i]), hex(one_at_a_time[i]))
                              for i in differ[:5]]


# Hand-worked cases of each result class: (float32 bits, float16 bits, bfloat16 bits).
CLASSES = [
    (0x3F800000, 0x3C00, 0x3F80),  # 1: exact
    (0x3F801000, 0x3C00, 0x3F80),  # 1 + 2^-11: a float16 tie, to the even 1
    (0x3F803000, 0x3C02, 0x3F80),  # 1 + 3 * 2^-11: a float16 tie, up to the even 1 + 2^-9
    (0x3F808000, 0x3C04, 0x3F80),  # 1 + 2^-8: a bfloat16 tie, to the even 1
    (0x3F818000, 0x3C0C, 0x3F82),  # 1 + 3 * 2^-8: a bfloat16 tie, up to the even 1 + 2^-6
    (0x3F808001, 0x3C04, 0x3F81),  # just past the bfloat16 tie: up
    (0xBF807FFF, 0xBC04, 0xBF80),  # just short of it, negative: down in magnitude
    (0x477FEFFF, 0x7BFF, 0x4780),  # just below 65520: float16's largest finite, 65504
    (0x477FF000, 0x7C00, 0x4780),  # 65520, the tie above 65504: to the even 65536, infinity
    (0xC77FF000, 0xFC00, 0xC780),  # -65520: -infinity
    (0x7F7F7FFF, 0x7C00, 0x7F7F),  # below bfloat16's tie above its largest finite
    (0x7F7F8000, 0x7C00, 0x7F80),  # the tie: to the even 2^128, infinity
    (0xFF7FFFFF, 0xFC00, 0xFF80),  # float's largest finite, negative: -infinity
    (0x387FC000, 0x03FF, 0x3880),  # (1 - 2^-10) * 2^-14: float16's largest subnormal
    (0x387FE000, 0x0400, 0x3880),  # the tie above it: up to the even 2^-14
    (0x33000000, 0x0000, 0x3300),  # 2^-25: the tie between 0 and 2^-24, to 0
    (0x33000001, 0x0001, 0x3300),  # just past it: the smallest subnormal
    (0x33C00000, 0x0002, 0x33C0),  # 3 * 2^-25: the tie between 2^-24 and 2^-23, to 2^-23
    (0xB3000000, 0x8000, 0xB300),  # -2^-25: -0
    (0x00018000, 0x0000, 0x0002),  # 1.5 * 2^-133: float subnormal, bfloat16's tie to the even 2
    (0x00028000, 0x0000, 0x0002),  # 2.5 * 2^-133: the tie to the even 2
    (0x00008000, 0x0000, 0x0000),  # 2^-134: the tie between 0 and 2^-133, to 0
    (0x80008001, 0x8000, 0x8001),  # just past it, negative
    (0x007FFFFF, 0x0000, 0x0080),  # float's largest subnormal: up to 2^-126
    (0x80000000, 0x8000, 0x8000),  # -0
    (0x7F800000, 0x7C00, 0x7F80),  # infinity
    (0x7FC00000, NAN_16, NAN_16),  # quiet NaN
    (0xFF800001, NAN_16, NAN_16),  # signalling NaN, negative: the canonical NaN all the same
    (0x7FFFFFFF, NAN_16, NAN_16),
]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "one-at-a-time"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_each_result_class_rounds_as_cvt_rn(dtype, packed):
    bits = np.array([c[0] for c in CLASSES], np.uint32)
    want = [c[1] if dtype == "f16" else c[2] for c in CLASSES]
    got = _narrow(dtype, packed, bits)
    wrong = [(hex(b), hex(g), hex(w)) for b, g, w in zip(bits, got, want) if g != w]
    assert wrong == []


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_the_bits_are_round_to_nearest_even(dtype):
    """Against another rounding: NumPy's float16 cast, torch's bfloat16 one (NaN aside: each
    writes its own NaN)."""
    bits = _near_boundaries(dtype)
    f = bits.view(np.float32)
    if dtype == "f16":
        with np.errstate(over="ignore"):
            want = f.astype(np.float16).view(np.uint16)
    else:
        torch = pytest.importorskip("torch")
        want = torch.from_numpy(f.copy()).to(torch.bfloat16).view(torch.int16).numpy()
        want = want.view(np.uint16)
    got = _narrow(dtype, False, bits)
    nan = np.isnan(f)
    assert (got[nan] == NAN_16).all()
    differ = np.flatnonzero((got != want) & ~nan)
    assert differ.size == 0, [(hex(bits[i]), hex(got[i]), hex(want[i])) for i in differ[:5]]
