// cek_row.cuh: row tiling, loads/stores and the block reduction shared by the cosine embedding
// loss kernels. The loader inlines this file into each kernel's source, so a change here changes
// every kernel's cache key.
//
// Tiling. A row of n_dim floats is cut into chunks of 4 consecutive elements (chunk j covers
// [4j, 4j + 4)). Thread t of a block owns chunks t, t + blockDim.x, ..., CHUNKS of them, so the
// whole row sits in registers between the reduction and the gradient write and x1, x2 are read
// from memory once. CHUNKS is fixed at compile time by BLOCK_SIZE; blockDim.x is the launcher's
// choice: the smallest multiple of 32 with blockDim.x * CHUNKS * 4 >= n_dim (so a 768-wide row
// runs 192 threads, none idle). blockDim.x is always a whole number of warps.
#pragma once

#define CEK_EPS 1e-12f  // PyTorch's EPSILON, added to each squared norm

constexpr int CEK_WARP = 32;
constexpr int CEK_MAX_THREADS = 1024;
// Past 16384 floats a row no longer fits in the 64 registers a thread may use at 1024 threads.
constexpr int CEK_MAX_BLOCK_SIZE = 16384;

__host__ __device__ constexpr int cek_chunks_per_thread(int block_size) {
    return block_size / (4 * CEK_MAX_THREADS) > 1 ? block_size / (4 * CEK_MAX_THREADS) : 1;
}

template <int BLOCK_SIZE>
struct CekRowContract {
    static_assert(BLOCK_SIZE >= 1 && (BLOCK_SIZE & (BLOCK_SIZE - 1)) == 0,
                  "BLOCK_SIZE must be a power of two");
    static_assert(BLOCK_SIZE <= CEK_MAX_BLOCK_SIZE, "BLOCK_SIZE must be at most 16384");
    static constexpr int CHUNKS = cek_chunks_per_thread(BLOCK_SIZE);
};

__device__ __forceinline__ bool cek_aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}

// 128-bit accesses need every row start 16-byte aligned: true for all rows exactly when the base
// pointers are and n_dim % 4 == 0. A view with an offset fails this and takes the scalar path.
__device__ __forceinline__ bool cek_vectorizable(int n_dim, const void* a, const void* b,
                                                 const void* c, const void* d) {
    return n_dim % 4 == 0 && cek_aligned16(a) && cek_aligned16(b) && cek_aligned16(c) &&
           cek_aligned16(d);
}

// Elements past n_dim load as 0, which adds nothing to the sums.
__device__ __forceinline__ float4 cek_load_chunk(const float* __restrict__ row, int chunk,
                                                 int n_dim, bool vec) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    const int k = chunk * 4;
    if (k >= n_dim) return v;
    if (vec) return __ldg(reinterpret_cast<const float4*>(row) + chunk);
    v.x = __ldg(row + k);
    if (k + 1 < n_dim) v.y = __ldg(row + k + 1);
    if (k + 2 < n_dim) v.z = __ldg(row + k + 2);
    if (k + 3 < n_dim) v.w = __ldg(row + k + 3);
    return v;
}

__device__ __forceinline__ void cek_store_chunk(float* __restrict__ row, int chunk, int n_dim,
                                                bool vec, float4 v) {
    const int k = chunk * 4;
    if (k >= n_dim) return;
    if (vec) {
        reinterpret_cast<float4*>(row)[chunk] = v;
        return;
    }
    row[k] = v.x;
    if (k + 1 < n_dim) row[k + 1] = v.y;
    if (k + 2 < n_dim) row[k + 2] = v.z;
    if (k + 3 < n_dim) row[k + 3] = v.w;
}

__device__ __forceinline__ float cek_warp_sum(float v) {
    for (int offset = CEK_WARP / 2; offset > 0; offset >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Sums (x, y, z) over the block and gives every thread the totals. One barrier: each warp
// publishes its partials and every thread adds all of them itself (at most 32 broadcast reads
// from shared memory), which costs less than a second barrier to broadcast one total. The
// summation order is fixed, so results are bitwise reproducible. Call once per kernel: the
// shared array is not protected against reuse.
__device__ __forceinline__ float3 cek_block_sum3(float3 v) {
    v.x = cek_warp_sum(v.x);
    v.y = cek_warp_sum(v.y);
    v.z = cek_warp_sum(v.z);
    const int n_warps = blockDim.x / CEK_WARP;
    if (n_warps == 1) return v;
    __shared__ float3 partial[CEK_MAX_THREADS / CEK_WARP];
    if (threadIdx.x % CEK_WARP == 0) partial[threadIdx.x / CEK_WARP] = v;
    __syncthreads();
    float3 total = make_float3(0.f, 0.f, 0.f);
    for (int w = 0; w < n_warps; ++w) {
        total.x += partial[w].x;
        total.y += partial[w].y;
        total.z += partial[w].z;
    }
    return total;
}

// One row of x1 and x2 held in registers, with its squared norms and dot product.
template <int CHUNKS>
struct CekRowPair {
    float4 a[CHUNKS];  // x1
    float4 b[CHUNKS];  // x2
    float sq1, sq2, dot;
};

template <int CHUNKS>
__device__ __forceinline__ void cek_load_row_pair(CekRowPair<CHUNKS>& rp,
                                                  const float* __restrict__ x1,
                                                  const float* __restrict__ x2, int n_dim,
                                                  bool vec) {
    float3 s = make_float3(0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
        const int chunk = threadIdx.x + i * blockDim.x;
        const float4 a = cek_load_chunk(x1, chunk, n_dim, vec);
        const float4 b = cek_load_chunk(x2, chunk, n_dim, vec);
        s.x += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        s.y += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
        s.z += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        rp.a[i] = a;
        rp.b[i] = b;
    }
    s = cek_block_sum3(s);
    rp.sq1 = s.x;
    rp.sq2 = s.y;
    rp.dot = s.z;
}

// dx1 = coeff*(x2*r2 - c*x1*r1)*r1 and dx2 = coeff*(x1*r1 - c*x2*r2)*r2 from the row in
// registers, expanded as p*x2 - q1*x1 and p*x1 - q2*x2 (fewer multiplies per element). With
// coeff == 0 every element is still written: 0 for finite inputs, NaN where the row has a NaN.
template <int CHUNKS>
__device__ __forceinline__ void cek_store_row_gradients(const CekRowPair<CHUNKS>& rp,
                                                        float* __restrict__ dx1,
                                                        float* __restrict__ dx2, int n_dim,
                                                        bool vec, float c, float r1, float r2,
                                                        float coeff) {
    const float p = coeff * r1 * r2;
    const float q1 = coeff * c * r1 * r1;
    const float q2 = coeff * c * r2 * r2;
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
        const int chunk = threadIdx.x + i * blockDim.x;
        const float4 a = rp.a[i], b = rp.b[i];
        cek_store_chunk(dx1, chunk, n_dim, vec,
                        make_float4(p * b.x - q1 * a.x, p * b.y - q1 * a.y, p * b.z - q1 * a.z,
                                    p * b.w - q1 * a.w));
        cek_store_chunk(dx2, chunk, n_dim, vec,
                        make_float4(p * a.x - q2 * b.x, p * a.y - q2 * b.y, p * a.z - q2 * b.z,
                                    p * a.w - q2 * b.w));
    }
}

// Loss of one row: 1 - c for y == 1, max(0, c - margin) for y == -1, 0 for any other label.
// Written so that a NaN c gives NaN for y == +-1 (fmaxf would turn it into 0).
__device__ __forceinline__ float cek_row_loss(float c, float y, float margin) {
    if (y == 1.f) return 1.f - c;
    if (y == -1.f) return c <= margin ? 0.f : c - margin;
    return 0.f;
}

// coeff = d loss / d c times the upstream gradient g.
__device__ __forceinline__ float cek_row_coeff(float c, float y, float margin, float g) {
    if (y == 1.f) return -g;
    if (y == -1.f && c > margin) return g;
    return 0.f;
}
