// cosine_embedding_loss_fused: the per-row loss and its gradient from one read of x1 and x2.
//
// Math, per row r of x1, x2 [n_rows, n_dim] (C-contiguous, T = float, double, cek_f16 or cek_bf16;
// sums and gradients in Acc = double for double, float otherwise; y, loss, scale, margin are Acc;
// dy is T), as in the forward and backward kernels:
//   c = dot*r1*r2 with r = 1/sqrt(sum x^2 + EPS), EPS = 1e-12
//   loss[r] = 1 - c if y[r] == 1;  max(0, c - margin) if y[r] == -1;  0 otherwise
//   g = scale * (dy ? dy[r * dy_stride] : 1)   upstream gradient: per row (dy_stride 1), one for
//                                      every row (dy_stride 0), or the scale alone (mean:
//                                      dy = nullptr, scale = 1/n_rows; sum: scale = 1)
//   coeff = -g if y[r] == 1;  g if y[r] == -1 and c > margin;  0 otherwise
//   dx1 = coeff*(x2*r2 - c*x1*r1)*r1,   dx2 = coeff*(x1*r1 - c*x2*r2)*r2
//   loss_out[r] = T(loss[r]) where loss_out is given (loss itself may then be nullptr): the
//   per-row losses in the inputs' type, reduction "none"'s result, with no cast launched after.
//   y_out[r] = y[r] where y_out is given: the labels as read, for a backward that recomputes
//   rows later (cek.torch's training step), so that no copy of them is launched before.
//
// Launch contract (BLOCK_SIZE = next_power_of_two(n_dim), at most 2^20; VEC = 16 / sizeof(T),
// ROW_CHUNKS = BLOCK_SIZE / VEC; see cek_tiling.cuh):
//   ROW_CHUNKS <= 64 and BLOCK_SIZE <= 256 (n_dim <= 256; 128 doubles), and 16-bit rows of
//     BLOCK_SIZE 1024 (n_dim 513..1024, four chunk pairs a lane): row groups. 256 threads a
//     block, GROUP (CekTiling::GROUP) lanes per row, grid [ceil(n_rows / (256 / GROUP)), 1,
//     1]: a warp or less per row, no barrier.
//   Above: grid [n_rows, 1, 1], one block per row, threads as in the backward kernel.
//
// Bytes moved (S = sizeof(T), A = sizeof(Acc)): read x1, x2 and write dx1, dx2 once, read y,
// write loss: 4*S*N*D + 2*A*N (16*N*D + 8*N in float), + S*N with a dy a row, + A*N with y_out,
// S*N in place of A*N with loss_out in place of loss.
// A streamed row is read twice: 6*S*N*D + 2*A*N.
// A mean or sum is a second launch, cosine_embedding_loss_reduce, over the per-row losses.
// These count ordinary rows: a row with a squared norm of 2^64 or more in float (2^512 in
// double) is summed again rescaled and read again (cek_huge.cuh, "Huge rows").
#include "cek_row.cuh"

// A row's label and dy[row] (1 without dy), loaded before the row itself so that all of a
// thread's loads are in flight together. The upstream gradient scale * dy is formed only where it
// is used, after the sums: a multiply here would wait for dy before the row's loads are issued.
template <typename T>
struct CekFusedLabels {
    CekAcc<T> label;
    T dy;
};

template <typename T>
__device__ __forceinline__ CekFusedLabels<T> cek_fused_labels(const CekAcc<T>* __restrict__ y,
                                                               const T* __restrict__ dy,
                                                               int dy_stride, int row) {
    return {y[row], cek_upstream_or_one(dy, dy_stride, row)};
}

// The row's gradient factors. scale * 1 is scale exactly, so without dy the upstream gradient
// is scale itself.
template <typename T>
__device__ __forceinline__ CekGradient<CekAcc<T>> cek_fused_gradient(CekCosine<CekAcc<T>> k,
                                                                     CekFusedLabels<T> l,
                                                                     CekAcc<T> scale,
                                                                     CekAcc<T> margin) {
    return cek_gradient(k,
                        cek_row_coeff(k.c, l.label, margin, scale * CekType<T>::to_acc(l.dy)));
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_fused(const T* __restrict__ x1, const T* __restrict__ x2,
                                            const CekAcc<T>* __restrict__ y,
                                            const T* __restrict__ dy, int dy_stride,
                                            CekAcc<T> scale, CekAcc<T>* __restrict__ loss,
                                            T* __restrict__ dx1, T* __restrict__ dx2,
                                            T* __restrict__ loss_out,
                                            CekAcc<T>* __restrict__ y_out, int n_rows, int n_dim,
                                            CekAcc<T> margin) {
    using Tiling = CekTiling<BLOCK_SIZE, T>;
    const bool vec = cek_vectorizable_flat<T>(n_dim, x1, x2, dx1, dx2);
    if constexpr (Tiling::GROUPED) {
        auto r = cek_group_row<BLOCK_SIZE, T>(n_rows, n_dim);
        // A lane past the last row reads row 0's (the launch has one), unused: a load under a
        // branch made ptxas widen a bfloat16 dy where the branches meet, before the row's loads
        // went out (two load rounds).
        const auto l = cek_fused_labels(y, dy, dy_stride, r.live ? r.row : 0);
        cek_group_row_cosine(r, x1, x2, n_dim, vec);
        if (!r.live) return;  // after the last shuffle
        const CekAcc<T> row_loss = cek_row_loss(r.k.c, l.label, margin);
        const auto g = cek_fused_gradient(r.k, l, scale, margin);
        if (r.lane == 0) {
            cek_store_row_loss(loss, loss_out, r.row, row_loss);
            if (y_out != nullptr) y_out[r.row] = l.label;
        }
        cek_store_row_gradients(r.rp, x1 + r.offset, x2 + r.offset, dx1 + r.offset,
                                dx2 + r.offset, n_dim, vec, r.lane, Tiling::GROUP, g);
    } else {
        const int row = blockIdx.x;
        if (row >= n_rows) return;  // uniform over the block
        const long long offset = static_cast<long long>(row) * n_dim;
        const auto l = cek_fused_labels(y, dy, dy_stride, row);
        CekRowPair<Tiling::CHUNKS, T> rp;
        // The loss is formed before the gradient and stored after it. Stored before it, the
        // tailed float16 kernel of 8192 spilled a register on sm_90 (32 registers: three blocks
        // of 672 threads); formed after it, ptxas kept the label for it in a uniform register,
        // whose move waited for the label's load before the row's loads went out (two load
        // rounds at 4096 floats).
        const CekAcc<T> row_loss = cek_block_row<BLOCK_SIZE, T>(
            rp, x1 + offset, x2 + offset, n_dim, vec,
            [&](const CekCosine<CekAcc<T>>& k, auto huge) {
                const CekAcc<T> row_loss = cek_row_loss(k.c, l.label, margin);
                cek_block_row_gradients<decltype(huge)::value, BLOCK_SIZE, T>(
                    rp, x1 + offset, x2 + offset, dx1 + offset, dx2 + offset, n_dim, vec,
                    cek_fused_gradient(k, l, scale, margin));
                return row_loss;
            },
            [&] {  // the label's copy: its load is in flight with the row's (cek_block_row)
                if (y_out != nullptr && threadIdx.x == 0) y_out[row] = l.label;
            });
        if (threadIdx.x == 0) cek_store_row_loss(loss, loss_out, row, row_loss);
    }
}
