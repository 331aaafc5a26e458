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
// Launch contract: grid [n_rows, 1, 1], one block per row. BLOCK_SIZE = next_power_of_two(n_dim),
// at most 16384. blockDim.x = the smallest multiple of 32 with blockDim.x * CHUNKS * 4 >= n_dim,
// CHUNKS = max(1, BLOCK_SIZE / 4096) (see cek_row.cuh); at most 1024 threads.
//
// Bytes moved: read x1, x2 and write dx1, dx2 once, read y, write loss, read dy when given:
// 16*N*D + 8*N (+ 4*N with dy).
#include "cek_row.cuh"

template <int BLOCK_SIZE>
__device__ void cosine_embedding_loss_fused(const float* __restrict__ x1,
                                            const float* __restrict__ x2,
                                            const float* __restrict__ y,
                                            const float* __restrict__ dy, float scale,
                                            float* __restrict__ loss, float* __restrict__ dx1,
                                            float* __restrict__ dx2, int n_rows, int n_dim,
                                            float margin) {
    constexpr int CHUNKS = CekRowContract<BLOCK_SIZE>::CHUNKS;
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // uniform over the block
    const long long offset = static_cast<long long>(row) * n_dim;
    const bool vec = cek_vectorizable(n_dim, x1, x2, dx1, dx2);

    CekRowPair<CHUNKS> rp;
    cek_load_row_pair(rp, x1 + offset, x2 + offset, n_dim, vec);

    const float r1 = rsqrtf(rp.sq1 + CEK_EPS);
    const float r2 = rsqrtf(rp.sq2 + CEK_EPS);
    const float c = rp.dot * r1 * r2;
    const float label = y[row];
    if (threadIdx.x == 0) loss[row] = cek_row_loss(c, label, margin);
    const float g = dy == nullptr ? scale : scale * dy[row];
    const float coeff = cek_row_coeff(c, label, margin, g);
    cek_store_row_gradients(rp, dx1 + offset, dx2 + offset, n_dim, vec, c, r1, r2, coeff);
}
