// Planted bug: threads past n_dim return before a barrier the others wait at.
template <int BLOCK_SIZE>
__device__ void planted_exit_before_barrier(const float* __restrict__ x, float* __restrict__ out,
                                            int n_rows, int n_dim) {
    if ((int)threadIdx.x >= n_dim) return;
    __shared__ float tile[1024];
    const long long i = (long long)blockIdx.x * n_dim + threadIdx.x;
    tile[threadIdx.x] = x[i];
    __syncthreads();
    out[i] = tile[n_dim - 1 - threadIdx.x];
}
