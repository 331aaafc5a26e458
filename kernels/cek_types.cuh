// cek_types.cuh: the element types the kernels take, and their conversions to the type they
// accumulate in. No CUDA header is included (NVRTC ships no cuda_fp16.h), so the half types are
// plain 16-bit structs with the same bits as torch.float16 / torch.bfloat16.
//
//   T         storage            Acc      VEC (elements per 16-byte chunk)
//   float     float              float    4
//   double    double             double   2
//   cek_f16   IEEE binary16      float    8
//   cek_bf16  bfloat16           float    8
//
// one() is 1 in T, as bits where T is a 16-bit type: no conversion instruction for a constant.
//
// Accumulating in float is what keeps half inputs safe: sq1, sq2 and dot never form in half (so
// a zero row, sq1 * sq2 overflowing 65504 or underflowing to 0 cannot turn into NaN, 1 or -inf).
#pragma once

struct cek_f16 {
    unsigned short bits;
};
struct cek_bf16 {
    unsigned short bits;
};

__device__ __forceinline__ float cek_float_from_bits(unsigned u) {
    union { unsigned u; float f; } pun;
    pun.u = u;
    return pun.f;
}

__device__ __forceinline__ unsigned cek_bits_from_float(float f) {
    union { unsigned u; float f; } pun;
    pun.f = f;
    return pun.u;
}

template <typename T>
struct CekType;

template <>
struct CekType<float> {
    using Acc = float;
    __device__ static __forceinline__ float one() { return 1.0f; }
    __device__ static __forceinline__ float to_acc(float v) { return v; }
    __device__ static __forceinline__ float from_acc(float v) { return v; }
};

template <>
struct CekType<double> {
    using Acc = double;
    __device__ static __forceinline__ double one() { return 1.0; }
    __device__ static __forceinline__ double to_acc(double v) { return v; }
    __device__ static __forceinline__ double from_acc(double v) { return v; }
};

// bfloat16 is the top half of a float: widening is a shift; narrowing rounds to nearest even.
template <>
struct CekType<cek_bf16> {
    using Acc = float;
    __device__ static __forceinline__ cek_bf16 one() { return {0x3f80}; }
    __device__ static __forceinline__ float to_acc(cek_bf16 v) {
        return cek_float_from_bits(static_cast<unsigned>(v.bits) << 16);
    }
    __device__ static __forceinline__ cek_bf16 from_acc(float f) {
        const unsigned u = cek_bits_from_float(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<unsigned short>((u >> 16) | 0x40u)};
        return {static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
    }
    // Widens two values packed lo | hi << 16: a shift and a mask, with no extraction of halves.
    __device__ static __forceinline__ void to_acc2(unsigned pair, float& lo, float& hi) {
        lo = cek_float_from_bits(pair << 16);
        hi = cek_float_from_bits(pair & 0xffff0000u);
    }
    // Two values at once, lo in the low half: one instruction on the GPU (sm_80 on), where the
    // integer rounding above takes about five per element.
    __device__ static __forceinline__ unsigned from_acc2(float lo, float hi) {
#ifdef __CUDA_ARCH__
        unsigned r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
#else
        return from_acc(lo).bits | static_cast<unsigned>(from_acc(hi).bits) << 16;
#endif
    }
};

// binary16: the GPU converts with one instruction; the CPU emulator, which has no such
// instruction, with the same IEEE round-to-nearest-even in integer arithmetic.
template <>
struct CekType<cek_f16> {
    using Acc = float;
    __device__ static __forceinline__ cek_f16 one() { return {0x3c00}; }
    __device__ static __forceinline__ float to_acc(cek_f16 v) {
#ifdef __CUDA_ARCH__
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
        return f;
#else
        const unsigned sign = (v.bits & 0x8000u) << 16, exp = (v.bits >> 10) & 0x1fu,
                       mant = v.bits & 0x3ffu;
        if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
            const float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
            return sign ? -f : f;
        }
        if (exp == 31) return cek_float_from_bits(sign | 0x7f800000u | (mant << 13));
        return cek_float_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
#endif
    }
    __device__ static __forceinline__ cek_f16 from_acc(float f) {
#ifdef __CUDA_ARCH__
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return {h};
#else
        unsigned u = cek_bits_from_float(f);
        const unsigned sign = (u >> 16) & 0x8000u;
        u &= 0x7fffffffu;
        unsigned short h;
        if (u >= 0x47800000u) {  // |f| >= 65536: inf, or NaN kept quiet
            h = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
        } else if (u < 0x38800000u) {  // below 2^-14: subnormal; the float add rounds for us
            h = static_cast<unsigned short>(
                cek_bits_from_float(cek_float_from_bits(u) + 0.5f) - 0x3f000000u);
        } else {  // rebias the exponent, round the 13 dropped bits to nearest even
            u += 0xc8000fffu + ((u >> 13) & 1u);
            h = static_cast<unsigned short>(u >> 13);
        }
        return {static_cast<unsigned short>(h | sign)};
#endif
    }
    // Two values at once, lo in the low half: one instruction on the GPU for two.
    __device__ static __forceinline__ unsigned from_acc2(float lo, float hi) {
#ifdef __CUDA_ARCH__
        unsigned r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
#else
        return from_acc(lo).bits | static_cast<unsigned>(from_acc(hi).bits) << 16;
#endif
    }
};

template <typename T>
using CekAcc = typename CekType<T>::Acc;

template <typename T>
struct CekIsBf16 {
    static constexpr bool value = false;
};
template <>
struct CekIsBf16<cek_bf16> {
    static constexpr bool value = true;
};

template <typename T>
struct CekVec {
    static constexpr int N = 16 / static_cast<int>(sizeof(T));
};

__device__ __forceinline__ float cek_rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ double cek_rsqrt(double x) { return 1.0 / sqrt(x); }
