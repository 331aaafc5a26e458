// cosine_embedding_loss_backward: gradient of the per-row cosine embedding loss.
//
// Math, per row r of x1, x2 [n_rows, n_dim] (float32, C-contiguous):
//   sq1 = sum x1^2,  sq2 = sum x2^2,  dot = sum x1*x2
//   r1 = 1/sqrt(sq1 + EPS),  r2 = 1/sqrt(sq2 + EPS),  EPS = 1e-12,  c = dot*r1*r2
//   dc/dx1[k] = (x2[k]*r2 - c*x1[k]*r1)*r1,   dc/dx2[k] = (x1[k]*r1 - c*x2[k]*r2)*r2
//   coeff = -dy[r] if y[r] == 1;  dy[r] if y[r] == -1 and c > margin;  0 otherwise
//   dx1 = coeff*dc/dx1,  dx2 = coeff*dc/dx2   (every element written, zeros included)
// (cek_store_row_gradients expands these to save multiplies.)
//
// Launch contract: grid [n_rows, 1, 1], one block per row. BLOCK_SIZE = next_power_of_two(n_dim),
// at most 2^20. Up to 16384, blockDim.x = the smallest multiple of 32 with
// blockDim.x * CHUNKS * 4 >= n_dim, CHUNKS = max(1, BLOCK_SIZE / 4096); above, 1024 threads
// stream the row (see cek_row.cuh).
//
// Bytes moved: read x1, x2 and write dx1, dx2 once (4 * n_rows * n_dim * 4), plus dy and y
// (2 * n_rows * 4): 16*N*D + 8*N. Above 16384 the row is read twice: 24*N*D + 8*N.
#include "cek_row.cuh"

template <int BLOCK_SIZE>
__device__ void cosine_embedding_loss_backward(const float* __restrict__ dy,
                                               const float* __restrict__ x1,
                                               const float* __restrict__ x2,
                                               const float* __restrict__ y,
                                               float* __restrict__ dx1, float* __restrict__ dx2,
                                               int n_rows, int n_dim, float margin) {
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // uniform over the block: no barrier is skipped by part of it
    // 64-bit offset: n_rows * n_dim may exceed 2^31.
    const long long offset = static_cast<long long>(row) * n_dim;
    const bool vec = cek_vectorizable(n_dim, x1, x2, dx1, dx2);

    CekRowPair<CekTiling<BLOCK_SIZE>::CHUNKS> rp;
    const CekCosine k = cek_block_row_cosine<BLOCK_SIZE>(rp, x1 + offset, x2 + offset, n_dim, vec);
    const float coeff = cek_row_coeff(k.c, y[row], margin, dy[row]);
    cek_block_row_gradients<BLOCK_SIZE>(rp, x1 + offset, x2 + offset, dx1 + offset, dx2 + offset,
                                        n_dim, vec, cek_gradient(k, coeff));
}
