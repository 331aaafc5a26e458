// cek_sums.cuh: a row's squared norms and dot product, accumulated from chunks and summed
// over a row group or a block, and its cosine.
#pragma once

#include "cek_tiling.cuh"
#include "cek_chunk.cuh"

// PyTorch's EPSILON, added to each squared norm. A float literal, as in ATen (Loss.cpp), so the
// double kernels add 1e-12f widened to double (9.999999960041972e-13), exactly as torch does.
#define CEK_EPS 1e-12f

// Squared norms and dot product, in the accumulation type.
template <typename Acc>
struct CekSums {
    Acc sq1, sq2, dot;
};

// Sums over each aligned group of GROUP lanes of a warp. Every lane of the warp must call it
// (full mask): lanes of rows past n_rows take part with zeros.
template <int GROUP, typename Acc>
__device__ __forceinline__ CekSums<Acc> cek_group_sum(CekSums<Acc> v) {
    for (int offset = GROUP / 2; offset > 0; offset >>= 1) {
        v.sq1 += __shfl_xor_sync(0xffffffffu, v.sq1, offset);
        v.sq2 += __shfl_xor_sync(0xffffffffu, v.sq2, offset);
        v.dot += __shfl_xor_sync(0xffffffffu, v.dot, offset);
    }
    return v;
}

// Reduces over the block and gives every thread the totals. One barrier: each warp publishes its
// partials, then every warp reads them all at once (lane w takes warp w % WARPS's) and reduces
// them with shuffles: one shared-memory load and at most 15 shuffles per warp, where looping
// over up to 32 partials in every thread costs 96 loads per thread (a 1024-thread block issues
// ~3000 warp loads for a row it reads with 64). Every warp adds in the same tree order (an xor
// butterfly only commutes operands), so all threads hold the same bits, run after run. A second
// call must pass a barrier after the first: the shared array is not protected against reuse.
//
// WARPS, a power of two, bounds the block's warps at compile time (CekTiling::WARPS): each
// aligned group of WARPS lanes reads every partial, so log2(WARPS) shuffle levels give every
// lane the totals. Five levels over 32 lanes, the partials past the block's warps zeros, add
// the same numbers in the same order (a partial is never -0: its sums start at +0), and a block
// of at most four warps (a float row of 513..1024) paid three levels, 9 shuffles and 9 adds a
// thread, for nothing.
template <int WARPS = CEK_MAX_THREADS / CEK_WARP, typename Acc>
__device__ __forceinline__ CekSums<Acc> cek_block_sum(CekSums<Acc> v) {
    static_assert(WARPS >= 1 && WARPS <= CEK_WARP && (WARPS & (WARPS - 1)) == 0,
                  "WARPS must be a power of two of at most 32");
    v = cek_group_sum<CEK_WARP>(v);
    const int n_warps = blockDim.x / CEK_WARP;
    if (WARPS == 1 || n_warps == 1) return v;
    __shared__ CekSums<Acc> partial[CEK_MAX_THREADS / CEK_WARP];
    const int lane = threadIdx.x % CEK_WARP;
    if (lane == 0) partial[threadIdx.x / CEK_WARP] = v;
    __syncthreads();
    CekSums<Acc> total = {0, 0, 0};
    const int slot = lane % WARPS;
    if (slot < n_warps) total = partial[slot];
    return cek_group_sum<WARPS>(total);
}

// Adds a chunk pair to the sums, each value first multiplied by its scale (1, or a power of two
// for a rescaled row: exact unless it underflows, where it adds nothing the sums could show).
// AGAIN: the pair was summed before, and is widened again by other instructions.
template <bool SCALED = false, bool AGAIN = false, typename T>
__device__ __forceinline__ void cek_accumulate(CekSums<CekAcc<T>>& s, const CekChunk<T>& a,
                                               const CekChunk<T>& b, CekAcc<T> s1 = 1,
                                               CekAcc<T> s2 = 1) {
    CekAcc<T> xs[CekVec<T>::N], zs[CekVec<T>::N];
    if constexpr (AGAIN) {  // else ptxas keeps the first sums' floats for the second
        cek_chunk_to_acc_again(a, xs);
        cek_chunk_to_acc_again(b, zs);
    } else {
        cek_chunk_to_acc(a, xs);
        cek_chunk_to_acc(b, zs);
    }
#pragma unroll
    for (int i = 0; i < CekVec<T>::N; ++i) {
        CekAcc<T> x = xs[i], z = zs[i];
        if (SCALED) x *= s1, z *= s2;
        s.sq1 += x * x;
        s.sq2 += z * z;
        s.dot += x * z;
    }
}

// Loads this lane's chunks of a row and returns its partial sums. Every load is issued before
// the first value is used: one round trip to memory per row, however many chunks.
template <int CHUNKS, typename T>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_load_row_pair(
    CekRowPair<CHUNKS, T>& rp, const T* __restrict__ x1, const T* __restrict__ x2, int n_dim,
    bool vec, int lane, int lanes) {
    cek_load_pairs(rp.a, rp.b, x1, x2, lane, lanes, n_dim, vec);
    CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) cek_accumulate(s, rp.a[i], rp.b[i]);
    return s;
}

// c, r1, r2 of a row from its sums; s1, s2 the scales its sums were taken with (1: ordinary).
template <typename Acc>
struct CekCosine {
    Acc c, r1, r2;
    Acc s1 = 1, s2 = 1;
};

template <typename Acc>
__device__ __forceinline__ CekCosine<Acc> cek_cosine(CekSums<Acc> s) {
    CekCosine<Acc> k;
    k.r1 = cek_rsqrt(s.sq1 + Acc(CEK_EPS));
    k.r2 = cek_rsqrt(s.sq2 + Acc(CEK_EPS));
    k.c = s.dot * k.r1 * k.r2;
    return k;
}

// The same for sums of values scaled by s1 and s2: EPS scales with the squared norm, so r1 and r2
// are those of the unscaled row divided by s1 and s2, and c is the row's (cek_scale_for).
template <typename Acc>
__device__ __forceinline__ CekCosine<Acc> cek_scaled_cosine(CekSums<Acc> s, Acc s1, Acc s2) {
    CekCosine<Acc> k;
    k.r1 = cek_rsqrt(s.sq1 + Acc(CEK_EPS) * s1 * s1);
    k.r2 = cek_rsqrt(s.sq2 + Acc(CEK_EPS) * s2 * s2);
    k.c = s.dot * k.r1 * k.r2;
    k.s1 = s1;
    k.s2 = s2;
    return k;
}
