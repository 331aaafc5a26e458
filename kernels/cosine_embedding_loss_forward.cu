// cosine_embedding_loss_forward: the per-row cosine embedding loss.
//
// Math, per row r of x1, x2 [n_rows, n_dim] (C-contiguous, T = float, double, cek_f16 or cek_bf16;
// sums in Acc = double for double, float otherwise; y, out, margin are Acc):
//   sq1 = sum x1^2,  sq2 = sum x2^2,  dot = sum x1*x2
//   r1 = 1/sqrt(sq1 + EPS),  r2 = 1/sqrt(sq2 + EPS),  EPS = 1e-12,  c = dot*r1*r2
//   out[r] = 1 - c if y[r] == 1;  max(0, c - margin) if y[r] == -1;  0 otherwise
// A NaN in a row gives a NaN loss for labels +-1.
//
// Launch contract: grid [n_rows, 1, 1], one block per row. BLOCK_SIZE = next_power_of_two(n_dim),
// at most 2^20; threads as in the backward kernel (see cek_row.cuh).
//
// Bytes moved (S = sizeof(T), A = sizeof(Acc)): read x1, x2 once, read y and write out:
// 2*S*N*D + 2*A*N (8*N*D + 8*N in float).
// These count ordinary rows: a row with a squared norm of 2^64 or more in float (2^512 in
// double) is summed again rescaled, a streamed one with one more read (cek_row.cuh, "Huge rows").
//
// cosine_embedding_loss_forward_rows: the same arguments and results, then four more for the
// reduced loss (partials, counter, reduced, reduction_scale: the fused kernel's, with its math
// and bytes), with the fused kernel's launch contract: rows of up to 64 chunks and 256 elements
// (float: n_dim <= 256) in row groups, 256 threads a block, GROUP = min(32, ROW_CHUNKS) lanes
// per row, grid [ceil(n_rows / (256 / GROUP)), 1, 1]; wider rows exactly as above. The faster
// variant for narrow rows (cek_row.cuh). With partials = nullptr it is the forward kernel; with
// partials given, out may be nullptr: the reduced loss alone, nothing of size N written.
#include "cek_row.cuh"

// The forward kernel's row, and the reduction when red.partials is given. The forward kernel
// itself passes none, a constant the compiler folds: its code is the seed's.
template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ void cek_forward_block_row(const T* __restrict__ x1,
                                                      const T* __restrict__ x2,
                                                      const CekAcc<T>* __restrict__ y,
                                                      CekAcc<T>* __restrict__ out, int n_rows,
                                                      int n_dim, CekAcc<T> margin,
                                                      const CekReduce<T>& red) {
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // uniform over the block
    const long long offset = static_cast<long long>(row) * n_dim;
    const bool vec = cek_vectorizable<T>(n_dim, x1, x2, x1, x2);

    // out may be null only with the reduction: the forward kernel's red is empty (a constant),
    // so its test folds and its code stays the seed's.
    CEK_ASSUME(red.partials != nullptr || out != nullptr);
    const CekAcc<T> label = y[row];  // in flight with the row (one load round)
    CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T> rp;
    const CekAcc<T> row_loss = cek_block_row<BLOCK_SIZE, T>(
        rp, x1 + offset, x2 + offset, n_dim, vec,
        [&](const CekCosine<CekAcc<T>>& k, auto) { return cek_row_loss(k.c, label, margin); });
    if (threadIdx.x == 0 && out != nullptr) out[row] = row_loss;  // uniform over the launch
    if (red.partials != nullptr)  // uniform over the launch
        cek_reduce_loss<true, T>(red, threadIdx.x == 0 ? row_loss : CekAcc<T>(0));
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_forward(const T* __restrict__ x1,
                                              const T* __restrict__ x2,
                                              const CekAcc<T>* __restrict__ y,
                                              CekAcc<T>* __restrict__ out, int n_rows, int n_dim,
                                              CekAcc<T> margin) {
    cek_forward_block_row<BLOCK_SIZE, T>(x1, x2, y, out, n_rows, n_dim, margin, CekReduce<T>{});
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_forward_rows(
    const T* __restrict__ x1, const T* __restrict__ x2, const CekAcc<T>* __restrict__ y,
    CekAcc<T>* __restrict__ out, int n_rows, int n_dim, CekAcc<T> margin,
    CekAcc<T>* __restrict__ partials, unsigned* __restrict__ counter, T* __restrict__ reduced,
    CekAcc<T> reduction_scale) {
    const CekReduce<T> red = {partials, counter, reduced, reduction_scale};
    if constexpr (CekTiling<BLOCK_SIZE, T>::GROUPED) {
        const bool vec = cek_vectorizable<T>(n_dim, x1, x2, x1, x2);
        auto r = cek_group_row<BLOCK_SIZE, T>(n_rows, n_dim);
        const CekAcc<T> label = r.live ? y[r.row] : 0;
        cek_group_row_cosine(r, x1, x2, n_dim, vec);
        const CekAcc<T> row_loss = cek_row_loss(r.k.c, label, margin);
        const bool writes = r.live && r.lane == 0;
        if (writes && out != nullptr) out[r.row] = row_loss;  // out: uniform over the launch
        if (partials != nullptr)  // uniform over the launch
            cek_reduce_loss<false, T>(red, writes ? row_loss : CekAcc<T>(0));
    } else {
        cek_forward_block_row<BLOCK_SIZE, T>(x1, x2, y, out, n_rows, n_dim, margin, red);
    }
}
