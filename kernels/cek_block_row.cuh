// cek_block_row.cuh: one block a row: the register path, tailed rows, and the streamed
// path's and huge rows' branches.
#pragma once

#include "cek_huge.cuh"
#include "cek_stream.cuh"

// A compile-time choice handed to a generic lambda (cek_block_row's `finish`).
template <bool B>
struct CekFlag {
    static constexpr bool value = B;
};

// A tailed row's elements past the chunks (CekTiling::TAILED): thread t holds element
// CHUNKS * VEC * blockDim.x + t of x1 and x2, if the row has it. An element, not a third chunk
// pair: two more registers where a chunk pair would take 8 or 16 past the 32 that three blocks
// an SM allow; a warp's 32 elements are still one 128-byte line. Between the sums and the
// gradient the pair waits in shared memory, widened to the accumulation type: kept in registers
// through the block reduction it made the float gradient kernels spill, stored as 16-bit values
// the bfloat16 backward kernel. Each thread reads back only its own pair: no barrier.
template <typename Acc>
struct CekTailPair {
    Acc x, z;
};

template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ CekTailPair<CekAcc<T>>& cek_tail_pair() {
    __shared__ CekTailPair<CekAcc<T>> pairs[CekTiling<BLOCK_SIZE, T>::TAIL_THREADS];
    return pairs[threadIdx.x];
}

template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ int cek_tail_element() {
    return CekTiling<BLOCK_SIZE, T>::CHUNKS * CekVec<T>::N * blockDim.x + threadIdx.x;
}

// The register path's loads and sums of this thread's part of a row, a tailed row's element
// included, its loads issued after the chunks' (issued before them, the element was widened
// before the chunk loads went out: two load rounds).
template <int BLOCK_SIZE, typename T, typename Loaded>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_load_block_row(
    CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T>& rp, const T* __restrict__ x1,
    const T* __restrict__ x2, int n_dim, bool vec, Loaded loaded) {
    if constexpr (!CekTiling<BLOCK_SIZE, T>::TAILED) {
        cek_load_pairs(rp.a, rp.b, x1, x2, threadIdx.x, blockDim.x, n_dim, vec);
        loaded();
        CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll
        for (int i = 0; i < CekTiling<BLOCK_SIZE, T>::CHUNKS; ++i)
            cek_accumulate(s, rp.a[i], rp.b[i]);
        return s;
    } else {
        cek_load_pairs(rp.a, rp.b, x1, x2, threadIdx.x, blockDim.x, n_dim, vec);
        const int k = cek_tail_element<BLOCK_SIZE, T>();
        const T zero = CekType<T>::from_acc(0);
        const T a = k < n_dim ? x1[k] : zero, b = k < n_dim ? x2[k] : zero;
        loaded();
        CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll
        for (int i = 0; i < CekTiling<BLOCK_SIZE, T>::CHUNKS; ++i)
            cek_accumulate(s, rp.a[i], rp.b[i]);
        const CekAcc<T> x = CekType<T>::to_acc(a), z = CekType<T>::to_acc(b);
        s.sq1 += x * x;
        s.sq2 += z * z;
        s.dot += x * z;
        if (k < n_dim) cek_tail_pair<BLOCK_SIZE, T>() = {x, z};
        return s;
    }
}

// This block's row: loads it (into rp on the register path; the streamed path loops over it),
// finds its cosine and returns finish(k, CekFlag<HUGE>{}). finish is inlined twice, once for
// ordinary rows and once, behind CEK_RARE_PATH, for huge ones, so the ordinary path's code and
// registers are its own: nothing of the huge branch joins it. The branch is uniform: every
// thread holds the same sums.
//
// loaded() runs once the row's loads are issued and before any loaded value is used (on the
// streamed path, once the row's first pass is summed): for work that waits on something loaded
// with them, such as the fused kernel's copy of the label, which placed anywhere else held a
// register through the row's work or made the thread wait before issuing the row's loads.
//
struct CekNothing {
    __device__ __forceinline__ void operator()() const {}
};

template <int BLOCK_SIZE, typename T, typename Finish, typename Loaded = CekNothing>
__device__ __forceinline__ auto cek_block_row(CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T>& rp,
                                              const T* __restrict__ x1,
                                              const T* __restrict__ x2, int n_dim, bool vec,
                                              Finish finish, Loaded loaded = {}) {
    CekSums<CekAcc<T>> s;
    if constexpr (CekTiling<BLOCK_SIZE, T>::STREAMED) {
        s = cek_stream_row_sums(x1, x2, n_dim, vec);
        loaded();  // after the loop: before it, warp 0 issued its first loads a round late
    } else {
        s = cek_load_block_row<BLOCK_SIZE>(rp, x1, x2, n_dim, vec, loaded);
    }
    s = cek_block_sum<CekTiling<BLOCK_SIZE, T>::WARPS>(s);
    if (cek_sums_ordinary(s)) return finish(cek_cosine(s), CekFlag<false>{});
    CEK_RARE_PATH();  // a huge row
    return finish(cek_block_huge_cosine<CekTiling<BLOCK_SIZE, T>::WARPS>(s, x1, x2, n_dim),
                  CekFlag<true>{});
}

// Writes this block's row of dx1, dx2: from registers, or read again on the streamed path and
// for a huge row (rescaled, element by element: cek_element_gradients).
template <bool HUGE, int BLOCK_SIZE, typename T>
__device__ __forceinline__ void cek_block_row_gradients(
    const CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T>& rp, const T* __restrict__ x1,
    const T* __restrict__ x2, T* __restrict__ dx1, T* __restrict__ dx2, int n_dim, bool vec,
    CekGradient<CekAcc<T>> g) {
    if constexpr (HUGE) {
        cek_element_gradients(x1, x2, dx1, dx2, n_dim, g);
    } else if constexpr (CekTiling<BLOCK_SIZE, T>::STREAMED) {
        cek_stream_row_gradients_pass(x1, x2, dx1, dx2, n_dim, vec, g);
    } else {
        // Widened again where the registers this saves buy blocks: not in blocks of 1024
        // threads, one an SM either way (16-bit rows of 16384, where it cost 45 instructions).
        constexpr bool AGAIN = CekTiling<BLOCK_SIZE, T>::CHUNKS >= 2 &&
                               CekTiling<BLOCK_SIZE, T>::THREADS < CEK_MAX_THREADS;
#pragma unroll
        for (int i = 0; i < CekTiling<BLOCK_SIZE, T>::CHUNKS; ++i)
            cek_store_chunk_gradients<false, AGAIN>(dx1, dx2, threadIdx.x + i * blockDim.x, n_dim,
                                                    vec, g, rp.a[i], rp.b[i]);
        if constexpr (CekTiling<BLOCK_SIZE, T>::TAILED) {
            const int k = cek_tail_element<BLOCK_SIZE, T>();
            if (k < n_dim) {
                const CekTailPair<CekAcc<T>> t = cek_tail_pair<BLOCK_SIZE, T>();
                const CekAcc<T> x = t.x, z = t.z;
                dx1[k] = CekType<T>::from_acc(g.p * z - g.q1 * x);
                dx2[k] = CekType<T>::from_acc(g.p * x - g.q2 * z);
            }
        }
    }
}
