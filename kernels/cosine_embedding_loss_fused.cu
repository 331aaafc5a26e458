// cosine_embedding_loss_fused: the per-row loss and its gradient from one read of x1 and x2.
//
// Math, per row r of x1, x2 [n_rows, n_dim] (C-contiguous, T = float, double, cek_f16 or cek_bf16;
// sums and gradients in Acc = double for double, float otherwise; y, dy, loss, scale, margin are
// Acc), as in the forward and backward kernels:
//   c = dot*r1*r2 with r = 1/sqrt(sum x^2 + EPS), EPS = 1e-12
//   loss[r] = 1 - c if y[r] == 1;  max(0, c - margin) if y[r] == -1;  0 otherwise
//   g = scale * (dy ? dy[r] : 1)       upstream gradient: per row, or one scalar scale
//                                      (mean: dy = nullptr, scale = 1/n_rows; sum: scale = 1)
//   coeff = -g if y[r] == 1;  g if y[r] == -1 and c > margin;  0 otherwise
//   dx1 = coeff*(x2*r2 - c*x1*r1)*r1,   dx2 = coeff*(x1*r1 - c*x2*r2)*r2
//
// Launch contract (BLOCK_SIZE = next_power_of_two(n_dim), at most 2^20; VEC = 16 / sizeof(T),
// ROW_CHUNKS = BLOCK_SIZE / VEC; see cek_row.cuh):
//   ROW_CHUNKS <= 64 and BLOCK_SIZE <= 256 (n_dim <= 256; 128 doubles): row groups. 256
//     threads a block, GROUP = min(32, ROW_CHUNKS) lanes per row, grid
//     [ceil(n_rows / (256 / GROUP)), 1, 1]: a warp or less per row, no barrier.
//   Above: grid [n_rows, 1, 1], one block per row, threads as in the backward kernel.
//
// Bytes moved (S = sizeof(T), A = sizeof(Acc)): read x1, x2 and write dx1, dx2 once, read y,
// write loss, read dy when given: 4*S*N*D + 2*A*N (+ A*N with dy); 16*N*D + 8*N in float. A
// streamed row is read twice: 6*S*N*D + 2*A*N.
// Reduced loss (partials != nullptr; cek_row.cuh, cek_reduce_loss): the kernel also writes
//   reduced[0] = T(reduction_scale * sum_r loss[r])   (mean: reduction_scale = 1/n_rows; sum: 1)
// from per-block partial sums added in block order by the last block to finish (found with
// *counter, which the launcher zeroes once and the kernel leaves at 0), bitwise the same run to
// run. partials: [gridDim.x] Acc workspace; counter: one unsigned; reduced: one T; the per-row
// losses are written as well, unless loss is nullptr (allowed only with partials: a mean or sum
// then writes nothing of size N but the gradients). Bytes, beside the above: 2*A*B (partials
// written, read; B = gridDim.x) + 4 (the counter: one atomic per block and the reset, on one
// word that stays in L2) + S (reduced), less A*N without the per-row losses. partials =
// nullptr: none of this, and the bytes above.
// These count ordinary rows: a row with a squared norm of 2^64 or more in float (2^512 in
// double) is summed again rescaled and read again (cek_row.cuh, "Huge rows").
#include "cek_row.cuh"

// A row's label and dy[row] (1 without dy), loaded before the row itself so that all of a
// thread's loads are in flight together. The upstream gradient scale * dy is formed only where it
// is used, after the sums: a multiply here would wait for dy before the row's loads are issued.
template <typename Acc>
struct CekFusedLabels {
    Acc label, dy;
};

template <typename Acc>
__device__ __forceinline__ CekFusedLabels<Acc> cek_fused_labels(const Acc* __restrict__ y,
                                                                 const Acc* __restrict__ dy,
                                                                 int row) {
    return {y[row], dy == nullptr ? Acc(1) : dy[row]};
}

// Writes the row's loss (one lane); returns it and the gradient factors of the row.
// scale * 1 is scale exactly, so without dy the upstream gradient is scale itself.
template <typename Acc>
struct CekFusedRow {
    Acc loss;
    CekGradient<Acc> g;
};

template <typename Acc>
__device__ __forceinline__ CekFusedRow<Acc> cek_fused_row(CekCosine<Acc> k, CekFusedLabels<Acc> l,
                                                          Acc scale, Acc* __restrict__ loss,
                                                          int row, int lane, Acc margin) {
    const Acc row_loss = cek_row_loss(k.c, l.label, margin);
    // The gradient's factors before the loss's store: the other way round ptxas spilled a
    // register in the float kernel at BLOCK_SIZE 4096 on sm_80.
    const auto g = cek_gradient(k, cek_row_coeff(k.c, l.label, margin, scale * l.dy));
    if (lane == 0 && loss != nullptr) loss[row] = row_loss;  // loss: uniform over the launch
    return {row_loss, g};
}

// The kernel's rows, and the reduced loss where red.partials is given. MAY_REDUCE = false (red
// empty, a constant the compiler folds) is the kernel without the reduction, instruction for
// instruction: its dead row-group lanes leave early, which they cannot do where they must join
// the block's sum.
template <bool MAY_REDUCE, int BLOCK_SIZE, typename T>
__device__ __forceinline__ void cek_fused_rows(const T* __restrict__ x1, const T* __restrict__ x2,
                                               const CekAcc<T>* __restrict__ y,
                                               const CekAcc<T>* __restrict__ dy, CekAcc<T> scale,
                                               CekAcc<T>* __restrict__ loss, T* __restrict__ dx1,
                                               T* __restrict__ dx2, int n_rows, int n_dim,
                                               CekAcc<T> margin, const CekReduce<T>& red) {
    using Tiling = CekTiling<BLOCK_SIZE, T>;
    const bool vec = cek_vectorizable_flat<T>(n_dim, x1, x2, dx1, dx2);
    CekAcc<T> share = 0;  // this thread's share of the block's losses, for the reduction
    // loss may be null only with the reduction: where red is empty (a constant) the test folds.
    CEK_ASSUME(red.partials != nullptr || loss != nullptr);
    if constexpr (Tiling::GROUPED) {
        auto r = cek_group_row<BLOCK_SIZE, T>(n_rows, n_dim);
        const auto l = r.live ? cek_fused_labels(y, dy, r.row) : CekFusedLabels<CekAcc<T>>{};
        cek_group_row_cosine(r, x1, x2, n_dim, vec);
        if constexpr (!MAY_REDUCE) {
            if (!r.live) return;  // after the last shuffle
        }
        if (r.live) {  // after the last shuffle; dead lanes still join the reduction's
            const auto f = cek_fused_row(r.k, l, scale, loss, r.row, r.lane, margin);
            cek_store_row_gradients(r.rp, x1 + r.offset, x2 + r.offset, dx1 + r.offset,
                                    dx2 + r.offset, n_dim, vec, r.lane, Tiling::GROUP, f.g);
            if (r.lane == 0) share = f.loss;
        }
    } else {
        const int row = blockIdx.x;
        if (row >= n_rows) return;  // uniform over the block
        const long long offset = static_cast<long long>(row) * n_dim;
        const auto l = cek_fused_labels(y, dy, row);
        CekRowPair<Tiling::CHUNKS, T> rp;
        const CekAcc<T> row_loss = cek_block_row<BLOCK_SIZE, T>(
            rp, x1 + offset, x2 + offset, n_dim, vec,
            [&](const CekCosine<CekAcc<T>>& k, auto huge) {
                const auto f = cek_fused_row(k, l, scale, loss, row, threadIdx.x, margin);
                cek_block_row_gradients<decltype(huge)::value, BLOCK_SIZE, T>(
                    rp, x1 + offset, x2 + offset, dx1 + offset, dx2 + offset, n_dim, vec, f.g);
                return f.loss;
            });
        if (threadIdx.x == 0) share = row_loss;
    }
    if (MAY_REDUCE && red.partials != nullptr)  // uniform over the launch
        cek_reduce_loss<!Tiling::GROUPED, T>(red, share);
}

// Row groups choose once, at the entry, between the kernel without the reduction and the one
// whose dead lanes stay for it; one block per row has no dead lanes (a block leaves whole), so
// it only tests partials after its gradients.
template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_fused(const T* __restrict__ x1, const T* __restrict__ x2,
                                            const CekAcc<T>* __restrict__ y,
                                            const CekAcc<T>* __restrict__ dy, CekAcc<T> scale,
                                            CekAcc<T>* __restrict__ loss, T* __restrict__ dx1,
                                            T* __restrict__ dx2, int n_rows, int n_dim,
                                            CekAcc<T> margin, CekAcc<T>* __restrict__ partials,
                                            unsigned* __restrict__ counter,
                                            T* __restrict__ reduced, CekAcc<T> reduction_scale) {
    if constexpr (CekTiling<BLOCK_SIZE, T>::GROUPED) {
        if (partials == nullptr) {  // uniform over the launch
            cek_fused_rows<false, BLOCK_SIZE, T>(x1, x2, y, dy, scale, loss, dx1, dx2, n_rows,
                                                 n_dim, margin, CekReduce<T>{});
            return;
        }
        // Once a launch: the static report reads the rows without the reduction.
        CEK_RARE_PATH();
    }
    cek_fused_rows<true, BLOCK_SIZE, T>(x1, x2, y, dy, scale, loss, dx1, dx2, n_rows, n_dim,
                                        margin, {partials, counter, reduced, reduction_scale});
}
