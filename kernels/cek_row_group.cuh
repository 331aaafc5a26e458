// cek_row_group.cuh: row groups, GROUP lanes of one warp a row, several rows a block.
#pragma once

#include "cek_huge.cuh"

// Row groups: GROUP lanes of one warp own a row, blockDim.x / GROUP rows a block (the tiling
// comment, cek_tiling.cuh). The lanes of rows past n_rows take part in the shuffles with
// zeros, so every lane calls this; a caller returns for !live rows only afterwards.
template <int BLOCK_SIZE, typename T>
struct CekGroupRow {
    using Tiling = CekTiling<BLOCK_SIZE, T>;
    int row, lane;
    bool live;
    long long offset;  // 64-bit: n_rows * n_dim may exceed 2^31
    CekRowPair<Tiling::GROUP_CHUNKS, T> rp;
    CekCosine<CekAcc<T>> k;
};

// This lane's row of a row group, `row` (live: a row to compute; the lanes of a group that is
// not live take part in the shuffles with zeros). The caller loads the row's labels with r.row
// before the row itself (cek_group_row_cosine), so that both are in flight together.
template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ CekGroupRow<BLOCK_SIZE, T> cek_group_row_at(int row, bool live,
                                                                       int n_dim) {
    static_assert(CekTiling<BLOCK_SIZE, T>::GROUPED,
                  "row groups need rows of at most 64 chunks, 256 elements (1024 in 16 bits)");
    CekGroupRow<BLOCK_SIZE, T> r;
    r.lane = threadIdx.x % CekTiling<BLOCK_SIZE, T>::GROUP;
    r.row = row;
    r.live = live;
    r.offset = live ? static_cast<long long>(row) * n_dim : 0;
    return r;
}

// The row of this lane's group where block b holds rows b * (blockDim.x / GROUP) onwards.
template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ CekGroupRow<BLOCK_SIZE, T> cek_group_row(int n_rows, int n_dim) {
    constexpr int GROUP = CekTiling<BLOCK_SIZE, T>::GROUP;
    // Below 2^31: the grid's rows, ceil(n_rows / R) * R for R a power of two, are at most 2^31
    // for n_rows < 2^31 (tests/test_large_offsets.py runs the last blocks at 2^31 - 100 rows).
    const int row = blockIdx.x * (blockDim.x / GROUP) + threadIdx.x / GROUP;
    return cek_group_row_at<BLOCK_SIZE, T>(row, row < n_rows, n_dim);
}

// Loads r's row and finds its cosine, rescaled as cek_block_row_cosine does for a row that is
// not ordinary. The shuffles take the whole warp, so the second sums run whenever a row of the
// warp needs them; an ordinary row's scales are 1 and its sums come out the same.
template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ void cek_group_row_cosine(CekGroupRow<BLOCK_SIZE, T>& r,
                                                     const T* __restrict__ x1,
                                                     const T* __restrict__ x2, int n_dim,
                                                     bool vec) {
    using Acc = CekAcc<T>;
    constexpr int GROUP = CekTiling<BLOCK_SIZE, T>::GROUP;
    auto s = cek_load_row_pair(r.rp, x1 + r.offset, x2 + r.offset, r.live ? n_dim : 0, vec,
                               r.lane, GROUP);
    s = cek_group_sum<GROUP>(s);
    if (cek_warp_ordinary(cek_sums_ordinary(s))) {
        r.k = cek_cosine(s);
        return;
    }
    CEK_RARE_PATH();  // a huge row in the warp
    const Acc s1 = cek_scale_for(s.sq1), s2 = cek_scale_for(s.sq2);
    r.k = cek_scaled_cosine(cek_group_sum<GROUP>(cek_row_pair_scaled_sums(r.rp, s1, s2)), s1, s2);
}
