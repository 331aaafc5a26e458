// Planted bug: a float4 load from a pointer one float past a 16-byte boundary.
template <int BLOCK_SIZE>
__device__ void planted_misaligned_float4(const float* __restrict__ x, float* __restrict__ out,
                                          int n_rows, int n_dim) {
    const float* row = x + (long long)blockIdx.x * n_dim;
    const float4 v = reinterpret_cast<const float4*>(row + 1)[threadIdx.x];
    out[(long long)blockIdx.x * n_dim + threadIdx.x] = v.x + v.y + v.z + v.w;
}
