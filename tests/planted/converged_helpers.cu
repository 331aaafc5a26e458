// No bug: the helpers of the divergent_helper_* kernels, each called once by every thread after
// a branch has rejoined. One copy of each, so every thread meets at the same barrier and shuffle.
__device__ __forceinline__ float planted_pair_sum(float v) {
    return v + __shfl_xor_sync(0xffffffffu, v, 1);
}

__device__ __forceinline__ void planted_barrier() { __syncthreads(); }

template <int BLOCK_SIZE>
__device__ void planted_converged_helpers(const float* __restrict__ x, float* __restrict__ out,
                                          int n_rows, int n_dim) {
    const long long i = (long long)blockIdx.x * n_dim + threadIdx.x;
    float v = x[i];
    if (threadIdx.x % 2) v = v * 3.0f;
    planted_barrier();
    out[i] = planted_pair_sum(v);
}
