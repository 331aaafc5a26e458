// Planted bug: thread 0 waits at the barrier for lanes 1..31 of its warp, which wait at a
// full-warp shuffle for thread 0. One barrier and one shuffle call site: a deadlock, not a
// divergence.
template <int BLOCK_SIZE>
__device__ void planted_deadlock(const float* __restrict__ x, float* __restrict__ out,
                                 int n_rows, int n_dim) {
    const long long i = (long long)blockIdx.x * n_dim + threadIdx.x;
    float v = x[i];
    if (threadIdx.x == 0) __syncthreads();
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    out[i] = v;
}
