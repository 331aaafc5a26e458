// cosine_embedding_loss_fused: the per-row loss and its gradient from one read of x1 and x2.
//
// Math, per row r of x1, x2 [n_rows, n_dim] (float32, C-contiguous), as in the forward and
// backward kernels:
//   c = dot*r1*r2 with r = 1/sqrt(sum x^2 + EPS), EPS = 1e-12
//   loss[r] = 1 - c if y[r] == 1;  max(0, c - margin) if y[r] == -1;  0 otherwise
//   g = scale * (dy ? dy[r] : 1)       upstream gradient: per row, or one scalar scale
//                                      (mean: dy = nullptr, scale = 1/n_rows; sum: scale = 1)
//   coeff = -g if y[r] == 1;  g if y[r] == -1 and c > margin;  0 otherwise
//   dx1 = coeff*(x2*r2 - c*x1*r1)*r1,   dx2 = coeff*(x1*r1 - c*x2*r2)*r2
//
// Launch contract (BLOCK_SIZE = next_power_of_two(n_dim), at most 2^20; see cek_row.cuh):
//   BLOCK_SIZE <= 256: row groups. 256 threads a block, GROUP = min(32, BLOCK_SIZE / 4) lanes per
//     row, so grid [ceil(n_rows / (256 / GROUP)), 1, 1]: a warp or less per row, no barrier.
//   BLOCK_SIZE > 256: grid [n_rows, 1, 1], one block per row, threads as in the backward kernel.
//
// Bytes moved: read x1, x2 and write dx1, dx2 once, read y, write loss, read dy when given:
// 16*N*D + 8*N (+ 4*N with dy). Above 16384 the row is read twice: 24*N*D + 8*N (+ 4*N).
#include "cek_row.cuh"

// Writes the loss (one lane) and returns the gradient factors of the row.
__device__ __forceinline__ CekGradient cek_fused_row(CekCosine k, const float* __restrict__ y,
                                                     const float* __restrict__ dy, float scale,
                                                     float* __restrict__ loss, int row, int lane,
                                                     float margin) {
    const float label = y[row];
    if (lane == 0) loss[row] = cek_row_loss(k.c, label, margin);
    const float g = dy == nullptr ? scale : scale * dy[row];
    return cek_gradient(k, cek_row_coeff(k.c, label, margin, g));
}

template <int BLOCK_SIZE>
__device__ void cosine_embedding_loss_fused(const float* __restrict__ x1,
                                            const float* __restrict__ x2,
                                            const float* __restrict__ y,
                                            const float* __restrict__ dy, float scale,
                                            float* __restrict__ loss, float* __restrict__ dx1,
                                            float* __restrict__ dx2, int n_rows, int n_dim,
                                            float margin) {
    using Tiling = CekTiling<BLOCK_SIZE>;
    const bool vec = cek_vectorizable(n_dim, x1, x2, dx1, dx2);
    if constexpr (BLOCK_SIZE <= CEK_MAX_GROUPED_BLOCK) {
        constexpr int GROUP = Tiling::GROUP;
        const int lane = threadIdx.x % GROUP;
        const int row = blockIdx.x * (blockDim.x / GROUP) + threadIdx.x / GROUP;
        // Lanes of rows past the end still join the shuffles, with zeros.
        const bool live = row < n_rows;
        const long long offset = live ? static_cast<long long>(row) * n_dim : 0;
        CekRowPair<Tiling::GROUP_CHUNKS> rp;
        const float3 s = cek_load_row_pair(rp, x1 + offset, x2 + offset, live ? n_dim : 0, vec,
                                           lane, GROUP);
        const CekCosine k = cek_cosine(cek_group_sum3<GROUP>(s));
        if (!live) return;  // after the last shuffle
        const CekGradient g = cek_fused_row(k, y, dy, scale, loss, row, lane, margin);
        cek_store_row_gradients(rp, dx1 + offset, dx2 + offset, n_dim, vec, lane, GROUP, g);
    } else {
        const int row = blockIdx.x;
        if (row >= n_rows) return;  // uniform over the block
        const long long offset = static_cast<long long>(row) * n_dim;
        CekRowPair<Tiling::CHUNKS> rp;
        const CekCosine k =
            cek_block_row_cosine<BLOCK_SIZE>(rp, x1 + offset, x2 + offset, n_dim, vec);
        const CekGradient g = cek_fused_row(k, y, dy, scale, loss, row, threadIdx.x, margin);
        cek_block_row_gradients<BLOCK_SIZE>(rp, x1 + offset, x2 + offset, dx1 + offset,
                                            dx2 + offset, n_dim, vec, g);
    }
}
