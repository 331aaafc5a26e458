// Planted bug: odd and even threads wait at two different barriers.
template <int BLOCK_SIZE>
__device__ void planted_divergent_syncthreads(const float* __restrict__ x,
                                              float* __restrict__ out, int n_rows, int n_dim) {
    const long long i = (long long)blockIdx.x * n_dim + threadIdx.x;
    if (threadIdx.x % 2) {
        out[i] = x[i];
        __syncthreads();
    } else {
        __syncthreads();
        out[i] = -x[i];
    }
}
