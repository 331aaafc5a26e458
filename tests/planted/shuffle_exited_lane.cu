// Planted bug: the upper half of each warp returns early, and the lower half then reads it.
template <int BLOCK_SIZE>
__device__ void planted_shuffle_exited_lane(const float* __restrict__ x, float* __restrict__ out,
                                            int n_rows, int n_dim) {
    const long long i = (long long)blockIdx.x * n_dim + threadIdx.x;
    if (threadIdx.x % 32 >= 16) return;
    out[i] = x[i] + __shfl_down_sync(0xffffffffu, x[i], 16);
}
