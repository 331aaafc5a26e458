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
// at most 2^20; threads as in the backward kernel (see cek_tiling.cuh).
//
// Bytes moved (S = sizeof(T), A = sizeof(Acc)): read x1, x2 once, read y and write out:
// 2*S*N*D + 2*A*N (8*N*D + 8*N in float).
// These count ordinary rows: a row with a squared norm of 2^64 or more in float (2^512 in
// double) is summed again rescaled, a streamed one with one more read (cek_huge.cuh, "Huge rows").
//
// cosine_embedding_loss_forward_rows: the same arguments and results, with the fused kernel's
// launch contract: rows of up to 64 chunks and 256 elements (float: n_dim <= 256), and 16-bit
// rows of 513..1024, in row groups,
// 256 threads a block, GROUP (CekTiling::GROUP) lanes per row, grid
// [ceil(n_rows / (256 / GROUP)), 1, 1]; wider rows exactly as above. The faster variant for
// narrow rows (cek_tiling.cuh). A mean or sum is a second launch, cosine_embedding_loss_reduce.
#include "cek_row.cuh"

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_forward(const T* __restrict__ x1,
                                              const T* __restrict__ x2,
                                              const CekAcc<T>* __restrict__ y,
                                              CekAcc<T>* __restrict__ out, int n_rows, int n_dim,
                                              CekAcc<T> margin) {
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // uniform over the block
    const long long offset = static_cast<long long>(row) * n_dim;
    const bool vec = cek_vectorizable<T>(n_dim, x1, x2, x1, x2);

    const CekAcc<T> label = y[row];  // in flight with the row (one load round)
    CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T> rp;
    const CekAcc<T> row_loss = cek_block_row<BLOCK_SIZE, T>(
        rp, x1 + offset, x2 + offset, n_dim, vec,
        [&](const CekCosine<CekAcc<T>>& k, auto) { return cek_row_loss(k.c, label, margin); });
    if (threadIdx.x == 0) out[row] = row_loss;
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_forward_rows(const T* __restrict__ x1,
                                                   const T* __restrict__ x2,
                                                   const CekAcc<T>* __restrict__ y,
                                                   CekAcc<T>* __restrict__ out, int n_rows,
                                                   int n_dim, CekAcc<T> margin) {
    if constexpr (CekTiling<BLOCK_SIZE, T>::GROUPED) {
        const bool vec = cek_vectorizable<T>(n_dim, x1, x2, x1, x2);
        auto r = cek_group_row<BLOCK_SIZE, T>(n_rows, n_dim);
        const CekAcc<T> label = r.live ? y[r.row] : 0;
        cek_group_row_cosine(r, x1, x2, n_dim, vec);
        if (r.live && r.lane == 0) out[r.row] = cek_row_loss(r.k.c, label, margin);
    } else {
        cosine_embedding_loss_forward<BLOCK_SIZE, T>(x1, x2, y, out, n_rows, n_dim, margin);
    }
}
