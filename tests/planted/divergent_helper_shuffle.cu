// Planted bug: one helper holding a __shfl_xor_sync, called from both arms of a branch that
// splits the warp. The source line is the same, but on a GPU each inlined copy is a shuffle of
// its own: the odd lanes wait at one, the even lanes at the other, and neither completes.
__device__ __forceinline__ float planted_pair_sum(float v) {
    return v + __shfl_xor_sync(0xffffffffu, v, 1);
}

template <int BLOCK_SIZE>
__device__ void planted_divergent_helper_shuffle(const float* __restrict__ x,
                                                 float* __restrict__ out, int n_rows,
                                                 int n_dim) {
    const long long i = (long long)blockIdx.x * n_dim + threadIdx.x;
    if (threadIdx.x % 2) {
        out[i] = planted_pair_sum(x[i]) * 3.0f;
    } else {
        out[i] = -planted_pair_sum(x[i] + 1.0f);
    }
}
