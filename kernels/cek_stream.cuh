// cek_stream.cuh: the streamed path, rows too wide for registers.
#pragma once

#include "cek_loss.cuh"

// The streamed path's partial sums: the block loops over the row, each thread with four chunk
// pairs in flight (all four issued, then summed), as one pair a trip would leave it waiting on
// memory for every 32 bytes. (A huge row is summed again by cek_block_huge_cosine.)
constexpr int CEK_STREAM_UNROLL = 4;

template <typename T>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_stream_row_sums(const T* __restrict__ x1,
                                                                   const T* __restrict__ x2,
                                                                   int n_dim, bool vec) {
    constexpr int U = CEK_STREAM_UNROLL;
    CekSums<CekAcc<T>> s = {0, 0, 0};
    const int n_chunks = (n_dim + CekVec<T>::N - 1) / CekVec<T>::N;
    const int stride = blockDim.x;
    int chunk = threadIdx.x;
    for (; chunk + (U - 1) * stride < n_chunks; chunk += U * stride) {
        CekChunk<T> a[U], b[U];
        cek_load_pairs(a, b, x1, x2, chunk, stride, n_dim, vec);
#pragma unroll
        for (int u = 0; u < U; ++u) cek_accumulate(s, a[u], b[u]);
    }
    for (; chunk < n_chunks; chunk += stride)
        cek_accumulate(s, cek_load_chunk(x1, chunk, n_dim, vec),
                       cek_load_chunk(x2, chunk, n_dim, vec));
    return s;
}

// The streamed path's gradient: the second read of the row (counted in the bytes formula).
// Backwards from this thread's last chunk: the end of the row, read last by the sums, is the
// part most likely still in L2. Four chunk pairs in flight a trip, as in the sums; two in a
// 16-bit type, whose conversions four would spill (at 1024 threads a thread has 64 registers;
// the fused kernel spilled 34 bytes on sm_80, the backward 8). A huge row's gradient is
// cek_element_gradients.
template <typename T>
__device__ __forceinline__ void cek_stream_row_gradients_pass(const T* __restrict__ x1,
                                                              const T* __restrict__ x2,
                                                              T* __restrict__ dx1,
                                                              T* __restrict__ dx2, int n_dim,
                                                              bool vec, CekGradient<CekAcc<T>> g) {
    constexpr int U = sizeof(T) == 2 ? CEK_STREAM_UNROLL / 2 : CEK_STREAM_UNROLL;
    const int n_chunks = (n_dim + CekVec<T>::N - 1) / CekVec<T>::N;
    const int first = threadIdx.x, stride = blockDim.x;
    int chunk = first < n_chunks ? first + (n_chunks - 1 - first) / stride * stride : -1;
    for (; chunk - (U - 1) * stride >= first; chunk -= U * stride) {
        CekChunk<T> a[U], b[U];
        cek_load_pairs(a, b, x1, x2, chunk, -stride, n_dim, vec);
#pragma unroll
        for (int u = 0; u < U; ++u)
            cek_store_chunk_gradients(dx1, dx2, chunk - u * stride, n_dim, vec, g, a[u], b[u]);
    }
    for (; chunk >= first; chunk -= stride)
        cek_store_chunk_gradients(dx1, dx2, chunk, n_dim, vec, g,
                                  cek_load_chunk(x1, chunk, n_dim, vec),
                                  cek_load_chunk(x2, chunk, n_dim, vec));
}
