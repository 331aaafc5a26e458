// Planted bug: the bound check lets each row write one element past its end, which for the last
// row is past the end of the array.
template <int BLOCK_SIZE>
__device__ void planted_off_by_one_store(const float* __restrict__ x, float* __restrict__ out,
                                         int n_rows, int n_dim) {
    const long long offset = (long long)blockIdx.x * n_dim;
    for (int k = threadIdx.x; k <= n_dim; k += blockDim.x) out[offset + k] = 2.f * x[offset];
}
