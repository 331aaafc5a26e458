// cek_row.cuh: row tiling, loads/stores and reductions shared by the cosine embedding loss
// kernels. The loader inlines this file into each kernel's source, so a change here changes
// every kernel's cache key.
//
// Tiling. A row of n_dim floats is cut into chunks of 4 consecutive elements (chunk j covers
// [4j, 4j + 4)). The threads that own a row ("lanes") take chunks lane, lane + lanes, ...
// Three paths, fixed at compile time by BLOCK_SIZE = next_power_of_two(n_dim):
//   * register path, BLOCK_SIZE <= 16384: one block per row, each thread holds CHUNKS =
//     max(1, BLOCK_SIZE / 4096) chunks in registers between the reduction and the gradient
//     write, so x1 and x2 are read once. blockDim.x is the launcher's choice: the smallest
//     multiple of 32 with blockDim.x * CHUNKS * 4 >= n_dim (a 768-wide row runs 192 threads).
//   * streamed path, BLOCK_SIZE > 16384: a row no longer fits in the 64 registers a thread may
//     use at 1024 threads, so 1024 threads loop over it, and a gradient kernel reads it twice.
//   * row groups (the fused kernel, BLOCK_SIZE <= 256): GROUP = min(32, BLOCK_SIZE / 4) lanes of
//     one warp own a row, 256 threads a block, so a block holds 256 / GROUP rows and the
//     reduction is warp shuffles only.
#pragma once

#define CEK_EPS 1e-12f  // PyTorch's EPSILON, added to each squared norm

constexpr int CEK_WARP = 32;
constexpr int CEK_MAX_THREADS = 1024;
constexpr int CEK_MAX_REGISTER_BLOCK = 16384;
constexpr int CEK_MAX_BLOCK_SIZE = 1 << 20;
constexpr int CEK_MAX_GROUPED_BLOCK = 256;
constexpr int CEK_GROUPED_THREADS = 256;

template <int BLOCK_SIZE>
struct CekTiling {
    static_assert(BLOCK_SIZE >= 1 && (BLOCK_SIZE & (BLOCK_SIZE - 1)) == 0,
                  "BLOCK_SIZE must be a power of two");
    static_assert(BLOCK_SIZE <= CEK_MAX_BLOCK_SIZE, "BLOCK_SIZE must be at most 2^20");
    static constexpr bool STREAMED = BLOCK_SIZE > CEK_MAX_REGISTER_BLOCK;
    static constexpr int CHUNKS =
        BLOCK_SIZE / (4 * CEK_MAX_THREADS) > 1 && !STREAMED ? BLOCK_SIZE / (4 * CEK_MAX_THREADS) : 1;
    // Row groups: lanes per row, and chunks per lane.
    static constexpr int GROUP = BLOCK_SIZE / 4 < 1 ? 1 : (BLOCK_SIZE / 4 > 32 ? 32 : BLOCK_SIZE / 4);
    static constexpr int GROUP_CHUNKS = BLOCK_SIZE / 4 / GROUP < 1 ? 1 : BLOCK_SIZE / 4 / GROUP;
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

// Sums over the first GROUP lanes of each aligned group of a warp. Every lane of the warp must
// call it (full mask): lanes of rows past n_rows take part with zeros.
template <int GROUP>
__device__ __forceinline__ float3 cek_group_sum3(float3 v) {
    for (int offset = GROUP / 2; offset > 0; offset >>= 1) {
        v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
        v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
        v.z += __shfl_xor_sync(0xffffffffu, v.z, offset);
    }
    return v;
}

// Sums (x, y, z) over the block and gives every thread the totals. One barrier: each warp
// publishes its partials and every thread adds all of them itself (at most 32 broadcast reads
// from shared memory), which costs less than a second barrier to broadcast one total. The
// summation order is fixed, so results are bitwise reproducible. Call once per kernel: the
// shared array is not protected against reuse.
__device__ __forceinline__ float3 cek_block_sum3(float3 v) {
    v = cek_group_sum3<CEK_WARP>(v);
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

__device__ __forceinline__ void cek_accumulate(float3& s, float4 a, float4 b) {
    s.x += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    s.y += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
    s.z += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// One row of x1 and x2 held in registers: this lane's CHUNKS chunks.
template <int CHUNKS>
struct CekRowPair {
    float4 a[CHUNKS];  // x1
    float4 b[CHUNKS];  // x2
};

// Loads this lane's chunks of a row and returns its partial (sq1, sq2, dot).
template <int CHUNKS>
__device__ __forceinline__ float3 cek_load_row_pair(CekRowPair<CHUNKS>& rp,
                                                    const float* __restrict__ x1,
                                                    const float* __restrict__ x2, int n_dim,
                                                    bool vec, int lane, int lanes) {
    float3 s = make_float3(0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
        const int chunk = lane + i * lanes;
        rp.a[i] = cek_load_chunk(x1, chunk, n_dim, vec);
        rp.b[i] = cek_load_chunk(x2, chunk, n_dim, vec);
        cek_accumulate(s, rp.a[i], rp.b[i]);
    }
    return s;
}

// The streamed path's partial sums: the block loops over the row.
__device__ __forceinline__ float3 cek_stream_row_sums(const float* __restrict__ x1,
                                                      const float* __restrict__ x2, int n_dim,
                                                      bool vec) {
    float3 s = make_float3(0.f, 0.f, 0.f);
    const int n_chunks = (n_dim + 3) / 4;
    for (int chunk = threadIdx.x; chunk < n_chunks; chunk += blockDim.x)
        cek_accumulate(s, cek_load_chunk(x1, chunk, n_dim, vec), cek_load_chunk(x2, chunk, n_dim, vec));
    return s;
}

// c, r1, r2 of a row from its (sq1, sq2, dot).
struct CekCosine {
    float c, r1, r2;
};

__device__ __forceinline__ CekCosine cek_cosine(float3 s) {
    CekCosine k;
    k.r1 = rsqrtf(s.x + CEK_EPS);
    k.r2 = rsqrtf(s.y + CEK_EPS);
    k.c = s.z * k.r1 * k.r2;
    return k;
}

// dx1 = coeff*(x2*r2 - c*x1*r1)*r1 and dx2 = coeff*(x1*r1 - c*x2*r2)*r2 for one chunk, expanded
// as p*x2 - q1*x1 and p*x1 - q2*x2 (fewer multiplies per element). With coeff == 0 every element
// is still written: 0 for finite inputs, NaN where the row has a NaN.
struct CekGradient {
    float p, q1, q2;
};

__device__ __forceinline__ CekGradient cek_gradient(CekCosine k, float coeff) {
    return {coeff * k.r1 * k.r2, coeff * k.c * k.r1 * k.r1, coeff * k.c * k.r2 * k.r2};
}

__device__ __forceinline__ void cek_store_chunk_gradients(float* __restrict__ dx1,
                                                          float* __restrict__ dx2, int chunk,
                                                          int n_dim, bool vec, CekGradient g,
                                                          float4 a, float4 b) {
    cek_store_chunk(dx1, chunk, n_dim, vec,
                    make_float4(g.p * b.x - g.q1 * a.x, g.p * b.y - g.q1 * a.y,
                                g.p * b.z - g.q1 * a.z, g.p * b.w - g.q1 * a.w));
    cek_store_chunk(dx2, chunk, n_dim, vec,
                    make_float4(g.p * a.x - g.q2 * b.x, g.p * a.y - g.q2 * b.y,
                                g.p * a.z - g.q2 * b.z, g.p * a.w - g.q2 * b.w));
}

template <int CHUNKS>
__device__ __forceinline__ void cek_store_row_gradients(const CekRowPair<CHUNKS>& rp,
                                                        float* __restrict__ dx1,
                                                        float* __restrict__ dx2, int n_dim,
                                                        bool vec, int lane, int lanes,
                                                        CekGradient g) {
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i)
        cek_store_chunk_gradients(dx1, dx2, lane + i * lanes, n_dim, vec, g, rp.a[i], rp.b[i]);
}

// The streamed path's gradient: the second read of the row (counted in the bytes formula).
__device__ __forceinline__ void cek_stream_row_gradients(const float* __restrict__ x1,
                                                         const float* __restrict__ x2,
                                                         float* __restrict__ dx1,
                                                         float* __restrict__ dx2, int n_dim,
                                                         bool vec, CekGradient g) {
    const int n_chunks = (n_dim + 3) / 4;
    for (int chunk = threadIdx.x; chunk < n_chunks; chunk += blockDim.x)
        cek_store_chunk_gradients(dx1, dx2, chunk, n_dim, vec, g,
                                  cek_load_chunk(x1, chunk, n_dim, vec),
                                  cek_load_chunk(x2, chunk, n_dim, vec));
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

// The (sq1, sq2, dot) of this block's row, on the register path (filling rp) or the streamed one.
template <int BLOCK_SIZE>
__device__ __forceinline__ CekCosine cek_block_row_cosine(
    CekRowPair<CekTiling<BLOCK_SIZE>::CHUNKS>& rp, const float* __restrict__ x1,
    const float* __restrict__ x2, int n_dim, bool vec) {
    float3 s;
    if constexpr (CekTiling<BLOCK_SIZE>::STREAMED)
        s = cek_stream_row_sums(x1, x2, n_dim, vec);
    else
        s = cek_load_row_pair(rp, x1, x2, n_dim, vec, threadIdx.x, blockDim.x);
    return cek_cosine(cek_block_sum3(s));
}

// Writes this block's row of dx1, dx2 from registers, or re-reads it on the streamed path.
template <int BLOCK_SIZE>
__device__ __forceinline__ void cek_block_row_gradients(
    const CekRowPair<CekTiling<BLOCK_SIZE>::CHUNKS>& rp, const float* __restrict__ x1,
    const float* __restrict__ x2, float* __restrict__ dx1, float* __restrict__ dx2, int n_dim,
    bool vec, CekGradient g) {
    if constexpr (CekTiling<BLOCK_SIZE>::STREAMED)
        cek_stream_row_gradients(x1, x2, dx1, dx2, n_dim, vec, g);
    else
        cek_store_row_gradients(rp, dx1, dx2, n_dim, vec, threadIdx.x, blockDim.x, g);
}
