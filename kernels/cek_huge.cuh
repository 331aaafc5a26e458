// cek_huge.cuh: huge rows, summed again with their values scaled by a power of two.
#pragma once

#include "cek_loss.cuh"

// Huge rows. A squared norm of float32 overflows from |x| ~ 1e19 on, and long before that the
// gradient factor coeff*r1*r2 falls below the smallest normal float, which the GPU flushes to 0.
// A row whose sq1 or sq2 reaches CekLimits::BIG (the square root of the largest finite value) is
// summed again (row groups from registers; one block per row reads it again element by element,
// cek_block_huge_cosine) with that side scaled by a power of two: MID where its squared norm was
// finite (then in [1, BIG)), FAR where it overflowed (then at least 2^-32, and the elements this
// flushes add less than 2^-74 of it). c is unchanged and EPS is scaled alike
// (cek_scaled_cosine); the gradient is formed from scaled values read again and scaled back
// (cek_store_row_gradients, cek_element_gradients); where its factors p or q1 underflow even
// so, so does the exact gradient. Ordinary rows pay one uniform compare; a NaN
// or inf in a row takes the same branch and keeps its NaN.
template <typename Acc>
struct CekLimits;
template <>
struct CekLimits<float> {
    static constexpr float BIG = 18446744073709551616.0f, MAX = 3.40282346638528859812e38f,
                           MID = 2.3283064365386963e-10f,     // 2^-32
                           FAR = 8.271806125530277e-25f;      // 2^-80
};
template <>
struct CekLimits<double> {
    static constexpr double BIG = 1.3407807929942597e154, MAX = 1.7976931348623157e308,
                            MID = 8.636168555094445e-78,      // 2^-256
                            FAR = 2.6497349136889905e-169;    // 2^-560
};

template <typename Acc>
__device__ __forceinline__ bool cek_sums_ordinary(const CekSums<Acc>& s) {
    return s.sq1 < CekLimits<Acc>::BIG && s.sq2 < CekLimits<Acc>::BIG;
}

// Whether every lane of the warp has an ordinary row.
__device__ __forceinline__ bool cek_warp_ordinary(bool ordinary) {
    return __all_sync(0xffffffffu, ordinary);
}

template <typename Acc>
__device__ __forceinline__ Acc cek_scale_for(Acc sq) {
    using L = CekLimits<Acc>;
    return sq < L::BIG ? Acc(1) : sq <= L::MAX ? L::MID : L::FAR;
}

// This lane's partial sums of a row in registers, its values scaled by s1 and s2.
template <int CHUNKS, typename T>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_row_pair_scaled_sums(
    const CekRowPair<CHUNKS, T>& rp, CekAcc<T> s1, CekAcc<T> s2) {
    CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i)  // widened again where lanes hold pairs (registers)
        cek_accumulate<true, (CHUNKS >= 2)>(s, rp.a[i], rp.b[i], s1, s2);
    return s;
}

// A huge row (or one with a NaN) on the one-block-per-row paths: summed again rescaled and its
// gradient written, each read again from memory element by element (coalesced across the
// block). Registers, not speed, decide this code: it is compiled beside the ordinary path, and
// what it holds live the ordinary path pays for too. Summed from rp (as row groups do) or a
// chunk at a time, it cost a 1024-thread block of two float chunk pairs a thread 47 registers
// where the ordinary path fits 32 (one block per SM instead of two). Only huge rows pay the read.
template <typename T>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_element_sums(const T* __restrict__ x1,
                                                                const T* __restrict__ x2,
                                                                int n_dim, CekAcc<T> s1,
                                                                CekAcc<T> s2) {
    CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll 1
    for (int i = threadIdx.x; i < n_dim; i += blockDim.x) {
        const CekAcc<T> x = CekType<T>::to_acc(x1[i]) * s1, z = CekType<T>::to_acc(x2[i]) * s2;
        s.sq1 += x * x;
        s.sq2 += z * z;
        s.dot += x * z;
    }
    return s;
}

template <typename T>
__device__ __forceinline__ void cek_element_gradients(const T* __restrict__ x1,
                                                      const T* __restrict__ x2,
                                                      T* __restrict__ dx1, T* __restrict__ dx2,
                                                      int n_dim, CekGradient<CekAcc<T>> g) {
#pragma unroll 1
    for (int i = threadIdx.x; i < n_dim; i += blockDim.x) {
        const CekAcc<T> x = CekType<T>::to_acc(x1[i]) * g.s1,
                        z = CekType<T>::to_acc(x2[i]) * g.s2;
        dx1[i] = CekType<T>::from_acc(g.s1 * (g.p * z - g.q1 * x));
        dx2[i] = CekType<T>::from_acc(g.s2 * (g.p * x - g.q2 * z));
    }
}

// WARPS: the block's cek_block_sum bound, the same as the ordinary path's, so that both share
// one array of partials in shared memory (each bound is an array of its own).
template <int WARPS, typename T>
__device__ __forceinline__ CekCosine<CekAcc<T>> cek_block_huge_cosine(CekSums<CekAcc<T>> s,
                                                                      const T* __restrict__ x1,
                                                                      const T* __restrict__ x2,
                                                                      int n_dim) {
    const CekAcc<T> s1 = cek_scale_for(s.sq1), s2 = cek_scale_for(s.sq2);
    s = cek_element_sums(x1, x2, n_dim, s1, s2);
    __syncthreads();  // every warp has read the first sums' partials
    return cek_scaled_cosine(cek_block_sum<WARPS>(s), s1, s2);
}
