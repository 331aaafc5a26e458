// cosine_embedding_loss_backward: gradient of the per-row cosine embedding loss.
//
// Math, per row r of x1, x2 [n_rows, n_dim] (C-contiguous, T = float, double, cek_f16 or cek_bf16;
// sums and gradients in Acc = double for double, float otherwise; dy, y, margin are Acc):
//   sq1 = sum x1^2,  sq2 = sum x2^2,  dot = sum x1*x2
//   r1 = 1/sqrt(sq1 + EPS),  r2 = 1/sqrt(sq2 + EPS),  EPS = 1e-12,  c = dot*r1*r2
//   dc/dx1[k] = (x2[k]*r2 - c*x1[k]*r1)*r1,   dc/dx2[k] = (x1[k]*r1 - c*x2[k]*r2)*r2
//   coeff = -dy[r] if y[r] == 1;  dy[r] if y[r] == -1 and c > margin;  0 otherwise
//   dx1 = coeff*dc/dx1,  dx2 = coeff*dc/dx2   (every element written, zeros included)
// (cek_store_row_gradients expands these to save multiplies.)
//
// Launch contract: grid [n_rows, 1, 1], one block per row. BLOCK_SIZE = next_power_of_two(n_dim),
// at most 2^20. With VEC = 16 / sizeof(T) elements per chunk and ROW_CHUNKS = BLOCK_SIZE / VEC:
// up to 4096 chunks, blockDim.x = the smallest multiple of 32 with blockDim.x * CHUNKS * VEC >=
// n_dim, CHUNKS = max(1, ROW_CHUNKS / 1024), and at least 2 for float from 1024 chunks (2049..4096
// floats: at most 512 threads), but 672 where that gives 704 or 736 at BLOCK_SIZE 8192 in float
// and 16-bit types (CekTiling::TAILED); above, 1024 threads stream the row (cek_row.cuh).
//
// Bytes moved (S = sizeof(T), A = sizeof(Acc)): read x1, x2 and write dx1, dx2 once, plus dy and
// y: 4*S*N*D + 2*A*N (16*N*D + 8*N in float). A streamed row is read twice: 6*S*N*D + 2*A*N.
// These count ordinary rows: a row with a squared norm of 2^64 or more in float (2^512 in
// double) is summed again rescaled and read again (cek_row.cuh, "Huge rows").
//
// cosine_embedding_loss_backward_rows: the same arguments and results, with the fused kernel's
// launch contract: rows of up to 64 chunks and 256 elements (float: n_dim <= 256) in row groups,
// 256 threads a block, GROUP = min(32, ROW_CHUNKS) lanes per row, grid
// [ceil(n_rows / (256 / GROUP)), 1, 1]; wider rows exactly as above. The faster variant for narrow rows: one block per row gives a
// 128-float row a one-warp block (cek_row.cuh).
//
// cosine_embedding_loss_backward_keep: the _rows variant with one more argument, keep_dy (Acc):
// a row whose dy equals keep_dy is left as it is in dx1 and dx2, after reading only its dy; a NaN
// keep_dy keeps no row. cek.torch's training step runs the fused kernel in the forward (the
// gradients for the upstream gradient its scale stands for) and this one in the backward with
// keep_dy = that scale: an upstream gradient of exactly 1 then costs O(N) bytes more, not a
// second pass over the rows. A row it recomputes costs what the backward kernel's row does, and
// one more memory round trip: dy is read first, then y and the row.
#include "cek_row.cuh"

// One row per block. KEEP: a row whose dy equals keep_dy returns before reading anything more
// (uniform over the block), leaving dx1 and dx2 as they are.
template <int BLOCK_SIZE, typename T, bool KEEP>
__device__ __forceinline__ void cek_backward_row(const CekAcc<T>* __restrict__ dy,
                                                 const T* __restrict__ x1,
                                                 const T* __restrict__ x2,
                                                 const CekAcc<T>* __restrict__ y,
                                                 T* __restrict__ dx1, T* __restrict__ dx2,
                                                 int n_rows, int n_dim, CekAcc<T> margin,
                                                 CekAcc<T> keep_dy) {
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // uniform over the block: no barrier is skipped by part of it
    if constexpr (KEEP) {
        if (dy[row] == keep_dy) return;  // a NaN keep_dy keeps no row
    }
    // 64-bit offset: n_rows * n_dim may exceed 2^31.
    const long long offset = static_cast<long long>(row) * n_dim;
    const bool vec = cek_vectorizable<T>(n_dim, x1, x2, dx1, dx2);

    // y and dy in flight with the row: one load round (two for KEEP, which reads dy first).
    const CekAcc<T> label = y[row], g = dy[row];
    CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T> rp;
    cek_block_row<BLOCK_SIZE, T>(
        rp, x1 + offset, x2 + offset, n_dim, vec,
        [&](const CekCosine<CekAcc<T>>& k, auto huge) {
            const CekAcc<T> coeff = cek_row_coeff(k.c, label, margin, g);
            cek_block_row_gradients<decltype(huge)::value, BLOCK_SIZE, T>(
                rp, x1 + offset, x2 + offset, dx1 + offset, dx2 + offset, n_dim, vec,
                cek_gradient(k, coeff));
        });
}

// Row groups where rows are narrow, one row per block otherwise. KEEP: a kept row is not live
// for its lanes: they load nothing (zeros in the shuffles) and store nothing.
template <int BLOCK_SIZE, typename T, bool KEEP>
__device__ __forceinline__ void cek_backward_rows(const CekAcc<T>* __restrict__ dy,
                                                  const T* __restrict__ x1,
                                                  const T* __restrict__ x2,
                                                  const CekAcc<T>* __restrict__ y,
                                                  T* __restrict__ dx1, T* __restrict__ dx2,
                                                  int n_rows, int n_dim, CekAcc<T> margin,
                                                  CekAcc<T> keep_dy) {
    using Tiling = CekTiling<BLOCK_SIZE, T>;
    if constexpr (Tiling::GROUPED) {
        const bool vec = cek_vectorizable<T>(n_dim, x1, x2, dx1, dx2);
        auto r = cek_group_row<BLOCK_SIZE, T>(n_rows, n_dim);
        const CekAcc<T> g = r.live ? dy[r.row] : 0;
        if constexpr (KEEP) r.live = r.live && !(g == keep_dy);
        const CekAcc<T> label = r.live ? y[r.row] : 0;
        cek_group_row_cosine(r, x1, x2, n_dim, vec);
        if (!r.live) return;  // after the last shuffle
        const CekAcc<T> coeff = cek_row_coeff(r.k.c, label, margin, g);
        cek_store_row_gradients(r.rp, x1 + r.offset, x2 + r.offset, dx1 + r.offset,
                                dx2 + r.offset, n_dim, vec, r.lane,
                                Tiling::GROUP, cek_gradient(r.k, coeff));
    } else {
        cek_backward_row<BLOCK_SIZE, T, KEEP>(dy, x1, x2, y, dx1, dx2, n_rows, n_dim, margin,
                                              keep_dy);
    }
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_backward(const CekAcc<T>* __restrict__ dy,
                                               const T* __restrict__ x1,
                                               const T* __restrict__ x2,
                                               const CekAcc<T>* __restrict__ y,
                                               T* __restrict__ dx1, T* __restrict__ dx2,
                                               int n_rows, int n_dim, CekAcc<T> margin) {
    cek_backward_row<BLOCK_SIZE, T, false>(dy, x1, x2, y, dx1, dx2, n_rows, n_dim, margin, 0);
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_backward_rows(const CekAcc<T>* __restrict__ dy,
                                                    const T* __restrict__ x1,
                                                    const T* __restrict__ x2,
                                                    const CekAcc<T>* __restrict__ y,
                                                    T* __restrict__ dx1, T* __restrict__ dx2,
                                                    int n_rows, int n_dim, CekAcc<T> margin) {
    cek_backward_rows<BLOCK_SIZE, T, false>(dy, x1, x2, y, dx1, dx2, n_rows, n_dim, margin, 0);
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_backward_keep(const CekAcc<T>* __restrict__ dy,
                                                    const T* __restrict__ x1,
                                                    const T* __restrict__ x2,
                                                    const CekAcc<T>* __restrict__ y,
                                                    T* __restrict__ dx1, T* __restrict__ dx2,
                                                    int n_rows, int n_dim, CekAcc<T> margin,
                                                    CekAcc<T> keep_dy) {
    cek_backward_rows<BLOCK_SIZE, T, true>(dy, x1, x2, y, dx1, dx2, n_rows, n_dim, margin,
                                           keep_dy);
}
