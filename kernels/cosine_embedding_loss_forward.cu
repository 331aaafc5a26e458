// cosine_embedding_loss_forward: the per-row cosine embedding loss.
//
// Math, per row r of x1, x2 [n_rows, n_dim] (float32, C-contiguous):
//   sq1 = sum x1^2,  sq2 = sum x2^2,  dot = sum x1*x2
//   r1 = 1/sqrt(sq1 + EPS),  r2 = 1/sqrt(sq2 + EPS),  EPS = 1e-12,  c = dot*r1*r2
//   out[r] = 1 - c if y[r] == 1;  max(0, c - margin) if y[r] == -1;  0 otherwise
// A NaN in a row gives a NaN loss for labels +-1.
//
// Launch contract: grid [n_rows, 1, 1], one block per row. BLOCK_SIZE = next_power_of_two(n_dim),
// at most 2^20. Up to 16384, blockDim.x = the smallest multiple of 32 with
// blockDim.x * CHUNKS * 4 >= n_dim, CHUNKS = max(1, BLOCK_SIZE / 4096); above, 1024 threads
// stream the row (see cek_row.cuh).
//
// Bytes moved: read x1, x2 once (2 * n_rows * n_dim * 4), read y and write out (2 * n_rows * 4):
// 8*N*D + 8*N.
#include "cek_row.cuh"

template <int BLOCK_SIZE>
__device__ void cosine_embedding_loss_forward(const float* __restrict__ x1,
                                              const float* __restrict__ x2,
                                              const float* __restrict__ y,
                                              float* __restrict__ out, int n_rows, int n_dim,
                                              float margin) {
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // uniform over the block
    const long long offset = static_cast<long long>(row) * n_dim;
    const bool vec = cek_vectorizable(n_dim, x1, x2, x1, x2);

    CekRowPair<CekTiling<BLOCK_SIZE>::CHUNKS> rp;  // unused once loaded: the compiler drops it
    const CekCosine k = cek_block_row_cosine<BLOCK_SIZE>(rp, x1 + offset, x2 + offset, n_dim, vec);
    if (threadIdx.x == 0) out[row] = cek_row_loss(k.c, y[row], margin);
}
