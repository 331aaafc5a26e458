// Planted bug: one helper holding a __syncthreads, called from both arms of a branch that
// splits the block: one source line, two barriers on a GPU, where each half waits for the other.
__device__ __forceinline__ void planted_barrier() { __syncthreads(); }

template <int BLOCK_SIZE>
__device__ void planted_divergent_helper_barrier(const float* __restrict__ x,
                                                 float* __restrict__ out, int n_rows,
                                                 int n_dim) {
    const long long i = (long long)blockIdx.x * n_dim + threadIdx.x;
    if (threadIdx.x % 2) {
        out[i] = x[i];
        planted_barrier();
    } else {
        planted_barrier();
        out[i] = -x[i];
    }
}
