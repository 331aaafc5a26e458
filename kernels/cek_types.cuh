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

// PTX's prmt.b32 (its default mode) for selectors whose nibbles are below 8: byte i of the
// result is byte (c >> 4i) & 7 of the eight bytes b:a, a's four the low ones. The emulator runs
// the definition, so the kernels' selectors are checked by the tests that run them on the CPU.
__device__ __forceinline__ unsigned cek_prmt(unsigned a, unsigned b, unsigned c) {
#ifdef __CUDA_ARCH__
    unsigned d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#else
    const unsigned long long bytes = static_cast<unsigned long long>(b) << 32 | a;
    unsigned d = 0;
    for (int i = 0; i < 4; ++i)
        d |= static_cast<unsigned>(bytes >> (8 * ((c >> (4 * i)) & 7u)) & 0xffu) << (8 * i);
    return d;
#endif
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

// The rounding instructions of PTX, one value (f16) or two (lo in the low half) at a time:
// round to nearest, ties to even; past the largest finite value, infinity of the sign; NaN
// becomes the canonical 0x7fff (the bits CUDA's own cuda_fp16.hpp and cuda_bf16.hpp give in
// their software versions of these instructions). `cvt.rn.f16.f32` runs on every arch; the
// packed two, `cvt.rn.f16x2.f32` and `cvt.rn.bf16x2.f32`, from sm_80 on. CEK_PACKED_CVT says
// whether the packed two are used: on the GPU by the arch; on the CPU emulator 1 unless a build
// defines it 0, so that the emulator runs both paths (tests/test_narrowing.py). There each
// instruction is modelled by its definition, in the FPU's own rounding (cek_model_rn), apart
// from the integer rounding that bfloat16 takes below sm_80 (cek_bf16_rn).
#if defined(__CUDA_ARCH__)
#define CEK_PACKED_CVT (__CUDA_ARCH__ >= 800)
#elif !defined(CEK_PACKED_CVT)
#define CEK_PACKED_CVT 1
#endif

#ifndef __CUDA_ARCH__
// The emulator runs float code with subnormals flushed (as -ftz=true compiles it; SSE's switches
// flush the conversions between float and double as well), where these instructions keep them:
// the models read and write float subnormals as integers and round in double, never meeting one.
inline double cek_pow2(int e) {  // 2^e, e in [-1022, 1023]
    union { unsigned long long u; double d; } pun;
    pun.u = static_cast<unsigned long long>(e + 1023) << 52;
    return pun.d;
}

// |f| (its bits `a`, sign cleared, no NaN) rounded to `digits` significant bits with an exponent
// of at least `min_exp` (the format's subnormals). Adding and taking away 1.5 * 2^52 units of
// the last place rounds once, in double, to nearest even.
inline double cek_model_rn(unsigned a, int digits, int min_exp) {
    const double size = a < 0x00800000u ? static_cast<double>(a) * cek_pow2(-149)
                                        : static_cast<double>(cek_float_from_bits(a));
    int exp = static_cast<int>(a >> 23) - 127;  // 1.m * 2^exp for a normal float
    if (exp < min_exp) exp = min_exp;
    const double big = 6755399441055744.0 * cek_pow2(exp - digits + 1);
    return (size + big) - big;
}

inline unsigned short cek_model_f16(float f) {
    const unsigned u = cek_bits_from_float(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fffu;
    const double r = cek_model_rn(a, 11, -14);
    if (r > 65504.0) return static_cast<unsigned short>(sign | 0x7c00u);
    if (r < 0x1p-14) return static_cast<unsigned short>(sign | static_cast<unsigned>(r * 0x1p24));
    return static_cast<unsigned short>(
        sign | ((cek_bits_from_float(static_cast<float>(r)) - 0x38000000u) >> 13));
}

inline unsigned short cek_model_bf16(float f) {
    const unsigned u = cek_bits_from_float(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fffu;
    const double r = cek_model_rn(a, 8, -126);  // float's exponents: subnormals from 2^-126
    const unsigned bits = r > static_cast<double>(cek_float_from_bits(0x7f7f0000u)) ? 0x7f800000u
                          : r < 0x1p-126 ? static_cast<unsigned>(r * 0x1p149)
                                         : cek_bits_from_float(static_cast<float>(r));
    return static_cast<unsigned short>(sign | bits >> 16);
}
#endif

__device__ __forceinline__ unsigned short cek_cvt_rn_f16(float f) {
#ifdef __CUDA_ARCH__
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#else
    return cek_model_f16(f);
#endif
}

#if CEK_PACKED_CVT
__device__ __forceinline__ unsigned cek_cvt_rn_f16x2(float lo, float hi) {
#ifdef __CUDA_ARCH__
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return cek_model_f16(lo) | static_cast<unsigned>(cek_model_f16(hi)) << 16;
#endif
}

__device__ __forceinline__ unsigned cek_cvt_rn_bf16x2(float lo, float hi) {
#ifdef __CUDA_ARCH__
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return cek_model_bf16(lo) | static_cast<unsigned>(cek_model_bf16(hi)) << 16;
#endif
}
#endif

// bfloat16 is the top half of a float: add just under half a unit of the dropped 16 bits, plus
// the kept last bit (ties to even), and cut; an overflow carries into infinity by itself.
__device__ __forceinline__ unsigned short cek_bf16_rn(float f) {
    const unsigned u = cek_bits_from_float(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// bfloat16 widens with a shift; it narrows one value at a time in integer arithmetic (no
// instruction before sm_90 rounds one), two with one instruction from sm_80 on.
template <>
struct CekType<cek_bf16> {
    using Acc = float;
    __device__ static __forceinline__ cek_bf16 one() { return {0x3f80}; }
    __device__ static __forceinline__ float to_acc(cek_bf16 v) {
        return cek_float_from_bits(static_cast<unsigned>(v.bits) << 16);
    }
    __device__ static __forceinline__ cek_bf16 from_acc(float f) { return {cek_bf16_rn(f)}; }
    // Widens two values packed lo | hi << 16: a shift and a mask, with no extraction of halves.
    __device__ static __forceinline__ void to_acc2(unsigned pair, float& lo, float& hi) {
        lo = cek_float_from_bits(pair << 16);
        hi = cek_float_from_bits(pair & 0xffff0000u);
    }
    // to_acc2 by byte permutes, which ptxas does not take for its shift and mask (a gradient's
    // second widening of a held pair: cek_chunk_to_acc_again).
    __device__ static __forceinline__ void to_acc2_again(unsigned pair, float& lo, float& hi) {
        lo = cek_float_from_bits(cek_prmt(pair, 0, 0x1044));  // bytes 1 0 of pair, then 0 0
        hi = cek_float_from_bits(cek_prmt(pair, 0, 0x3244));  // bytes 3 2 of pair, then 0 0
    }
    // Two values at once, lo in the low half: one instruction, where the integer rounding
    // takes about five per value.
    __device__ static __forceinline__ unsigned from_acc2(float lo, float hi) {
#if CEK_PACKED_CVT
        return cek_cvt_rn_bf16x2(lo, hi);
#else
        return cek_bf16_rn(lo) | static_cast<unsigned>(cek_bf16_rn(hi)) << 16;
#endif
    }
};

// binary16: one instruction converts either way on the GPU; the CPU emulator widens exactly in
// integer arithmetic.
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
    __device__ static __forceinline__ cek_f16 from_acc(float f) { return {cek_cvt_rn_f16(f)}; }
    // Two values packed lo | hi << 16, converted from the pair with its halves swapped by a
    // byte permute: ptxas does not take these for the conversions of the unswapped halves that
    // the sums made (a gradient's second widening of a held pair: cek_chunk_to_acc_again).
    __device__ static __forceinline__ void to_acc2_again(unsigned pair, float& lo, float& hi) {
        const unsigned swapped = cek_prmt(pair, 0, 0x1032);  // hi | lo << 16
        lo = to_acc({static_cast<unsigned short>(swapped >> 16)});
        hi = to_acc({static_cast<unsigned short>(swapped & 0xffffu)});
    }
    // Two values at once, lo in the low half: one instruction for two from sm_80 on, one each
    // before (as cuda_fp16.hpp's __floats2half2_rn does).
    __device__ static __forceinline__ unsigned from_acc2(float lo, float hi) {
#if CEK_PACKED_CVT
        return cek_cvt_rn_f16x2(lo, hi);
#else
        return cek_cvt_rn_f16(lo) | static_cast<unsigned>(cek_cvt_rn_f16(hi)) << 16;
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
