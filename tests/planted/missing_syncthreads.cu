// Planted bug: the block reduction of a row sum lost the __syncthreads between the warps
// publishing their partial sums and every thread reading them.
template <int BLOCK_SIZE>
__device__ void planted_missing_syncthreads(const float* __restrict__ x, float* __restrict__ out,
                                            int n_rows, int n_dim) {
    const int row = blockIdx.x;
    float v = 0.f;
    for (int k = threadIdx.x; k < n_dim; k += blockDim.x) v += x[(long long)row * n_dim + k];
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    __shared__ float partial[32];
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    // __syncthreads();  <- deleted
    float total = 0.f;
    for (int w = 0; w < (int)blockDim.x / 32; ++w) total += partial[w];
    if (threadIdx.x == 0) out[row] = total;
}
