// Planted bug: atomicCAS is outside the emulator's subset.
template <int BLOCK_SIZE>
__device__ void planted_outside_subset(const float* __restrict__ x, float* __restrict__ out,
                                       int n_rows, int n_dim) {
    const long long i = (long long)blockIdx.x * n_dim + threadIdx.x;
    out[i] = x[i];
    atomicCAS(reinterpret_cast<int*>(out), 0, 1);
}
