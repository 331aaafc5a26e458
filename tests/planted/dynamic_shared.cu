// Not a bug: reverses each row through dynamic shared memory (shared_mem = n_dim floats).
template <int BLOCK_SIZE>
__device__ void planted_dynamic_shared(const float* __restrict__ x, float* __restrict__ out,
                                       int n_rows, int n_dim) {
    extern __shared__ float tile[];
    const long long row = (long long)blockIdx.x * n_dim;
    for (int k = threadIdx.x; k < n_dim; k += blockDim.x) tile[k] = x[row + k];
    __syncthreads();
    for (int k = threadIdx.x; k < n_dim; k += blockDim.x) out[row + k] = tile[n_dim - 1 - k];
}
