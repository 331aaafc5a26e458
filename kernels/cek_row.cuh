// cek_row.cuh: row tiling, loads/stores and reductions shared by the cosine embedding loss
// kernels. The loader inlines this file into each kernel's source, so a change here changes
// every kernel's cache key.
//
// Tiling. A row of n_dim elements of type T is cut into 16-byte chunks of VEC = 16 / sizeof(T)
// elements (chunk j covers [j*VEC, (j+1)*VEC)). The threads that own a row ("lanes") take chunks
// lane, lane + lanes, ... Three paths, fixed at compile time by BLOCK_SIZE =
// next_power_of_two(n_dim) and T, with ROW_CHUNKS = max(1, BLOCK_SIZE / VEC):
//   * register path, ROW_CHUNKS <= 4096 (2048 for 2-byte T, whose conversions need registers
//     too; either way rows of up to 16384 elements, 8192 doubles): one block per row; each
//     thread holds CHUNKS = max(1, ROW_CHUNKS / 1024) chunks (at least 2 for float and 16-bit
//     rows of 256 chunks and more: BLOCK_SIZE >= 1024 in float, >= 2048 in 16-bit types) in
//     registers between the reduction and the gradient write, so x1 and x2 are read once.
//     blockDim.x is the launcher's choice: the smallest multiple of 32 with blockDim.x * CHUNKS
//     * VEC >= n_dim (a 768-wide float row: 96 threads), but 672 where that is 704 or 736 at
//     BLOCK_SIZE 8192 in float (CekTiling::TAILED): a thread then holds one element past its
//     chunks.
//   * streamed path, above that: a row no longer fits in the 64 registers a thread may
//     use at 1024 threads, so 1024 threads loop over it, and a gradient kernel reads it twice.
//   * row groups (the fused kernel and the *_rows variants of forward and backward, ROW_CHUNKS
//     <= 64 and BLOCK_SIZE <= 256: 256 floats or halves, 128 doubles; and 16-bit rows of
//     BLOCK_SIZE 1024, four chunk pairs a lane, CEK_GROUPED_16_BIT_SIZE): GROUP = min(32,
//     ROW_CHUNKS) lanes of one warp own a row (half the chunks, two pairs a lane, for float and
//     16-bit rows of 2..32 chunks: CekTiling::GROUP), 256 threads a block, so a block holds
//     256 / GROUP rows and the reduction is warp shuffles only. One block per row would leave a
//     128-float row a one-warp block: too few warps per SM to keep enough loads in flight, and
//     a block launched for every 1 KB of input.
#pragma once

#include "cek_types.cuh"

// PyTorch's EPSILON, added to each squared norm. A float literal, as in ATen (Loss.cpp), so the
// double kernels add 1e-12f widened to double (9.999999960041972e-13), exactly as torch does.
#define CEK_EPS 1e-12f

constexpr int CEK_WARP = 32;
constexpr int CEK_MAX_THREADS = 1024;
// Float and 16-bit rows of this many chunks or more (BLOCK_SIZE >= 1024: 513 floats and up;
// BLOCK_SIZE >= 2048: 1025 16-bit values and up) take at least two chunk pairs a thread
// (CekTiling::MIN_CHUNKS).
constexpr int CEK_TWO_PAIRS_FROM_CHUNKS = 256;
constexpr int CEK_MAX_GROUPED_CHUNKS = 64;
// Row groups take rows of at most 256 elements too: a 16-bit lane holding two chunk pairs needs
// 56 registers (half the SM's threads), where one block per row of 257..512 halves runs 64
// threads of one pair at 32 registers (all of them).
constexpr int CEK_MAX_GROUPED_SIZE = 256;
// ... and 16-bit rows of 513..1024 (BLOCK_SIZE 1024): a warp a row, four chunk pairs a lane, at
// 64 registers (half an SM). One block per row ran them at one pair a thread, three or four warps
// a block, each thread issuing the block's sums and cosine for 16 bytes of a row: 62% of an
// H200's issue slots at the copy rate at D = 768 (fused). A warp a row needs no barrier and
// spreads that work over 64 bytes a lane: 43%, with 96 KB in flight an SM where 63 KB were.
constexpr int CEK_GROUPED_16_BIT_SIZE = 1024;
constexpr int CEK_MAX_BLOCK_SIZE = 1 << 20;
constexpr int CEK_GROUPED_THREADS = 256;

__host__ __device__ constexpr int cek_pow2_at_least(int n) {
    return n <= 1 ? 1 : 2 * cek_pow2_at_least((n + 1) / 2);
}

template <int BLOCK_SIZE, typename T>
struct CekTiling {
    static_assert(BLOCK_SIZE >= 1 && (BLOCK_SIZE & (BLOCK_SIZE - 1)) == 0,
                  "BLOCK_SIZE must be a power of two");
    static_assert(BLOCK_SIZE <= CEK_MAX_BLOCK_SIZE, "BLOCK_SIZE must be at most 2^20");
    static constexpr int VEC = CekVec<T>::N;
    static constexpr int ROW_CHUNKS = BLOCK_SIZE / VEC > 1 ? BLOCK_SIZE / VEC : 1;
    static constexpr int MAX_REGISTER_CHUNKS = sizeof(T) >= 4 ? 4096 : 2048;
    static constexpr bool STREAMED = ROW_CHUNKS > MAX_REGISTER_CHUNKS;
    static constexpr bool GROUPED =
        (ROW_CHUNKS <= CEK_MAX_GROUPED_CHUNKS && BLOCK_SIZE <= CEK_MAX_GROUPED_SIZE) ||
        (sizeof(T) == 2 && BLOCK_SIZE == CEK_GROUPED_16_BIT_SIZE);
    // Float rows of 256 chunks and more (513 floats and up) take two chunk pairs a thread, at the
    // 32 registers two float pairs fit since the huge-row path reads the row again:
    //  - 1024 chunks (2049..4096 floats): at most 512 threads a block. With one pair, blocks of
    //    683..1023 threads fit two an SM (67-100%; D = 3072: 75%), with two, blocks of 257..512
    //    threads fit four to seven (81-100%).
    //  - 256 and 512 chunks (513..2048 floats): a thread has 64 bytes in flight where one pair
    //    gave it 32, and the row's once-a-thread work (the block's sums, the cosine, the
    //    labels) is spread over twice the bytes. At D = 768 on sm_90: 96 threads a block, 21
    //    an SM (98%), 126 KB in flight an SM where 192 threads had 60 KB, 2.4 instructions a
    //    DRAM byte where they issued 3.9 (`cek compile --report`: 31% of the issue slots at the
    //    copy rate, where they took 50%).
    // 16-bit rows too, from 256 chunks (1025 values and up), at 40 registers (3/4 of an SM):
    //  their gradient widens the held chunks again by other instructions than the sums did
    //  (CekType::to_acc2_again), so that ptxas holds the 16-bit pairs through the block's
    //  reduction, not the floats widened from them (twice the registers: 56 to 64, half an SM).
    //  At D = 4096 in bfloat16 on sm_90: 256 threads a block, 96 KB in flight an SM where 512
    //  threads had 64 KB, 3.2 instructions a DRAM byte where they issued 5.0 (46% of the issue
    //  slots at the copy rate, where they took 64%). Not below 256 chunks: a 768-wide 16-bit
    //  row would run 48 threads, two warps, one of them half idle.
    static constexpr int MIN_CHUNKS =
        sizeof(T) <= 4 && sizeof(T) >= 2 && ROW_CHUNKS >= CEK_TWO_PAIRS_FROM_CHUNKS ? 2 : 1;
    static constexpr int CHUNKS =
        STREAMED ? 1
                 : ROW_CHUNKS / CEK_MAX_THREADS > MIN_CHUNKS ? ROW_CHUNKS / CEK_MAX_THREADS
                                                             : MIN_CHUNKS;
    // Float and 16-bit rows of 2..32 chunks take two chunk pairs a lane (ROW_CHUNKS / 2 lanes a
    // row): 64 bytes of loads a lane, and the row's shuffles and cosine over twice the bytes. At
    // D = 128 on sm_90 the fused kernel takes 26% (float) and 40% (bfloat16) of the issue slots
    // at the copy rate, with 97 KB in flight an SM, where one pair a lane took 43% and 53% with
    // 64 KB and 49 KB (40 registers, 75%, as the row groups of 256 floats had already).
    static constexpr int GROUP =
        ROW_CHUNKS > CEK_WARP ? CEK_WARP
        : ROW_CHUNKS >= 2 && sizeof(T) <= 4 && sizeof(T) >= 2 ? ROW_CHUNKS / 2
                                                               : ROW_CHUNKS;
    static constexpr int GROUP_CHUNKS = ROW_CHUNKS / GROUP;
    static constexpr int GROUPED_THREADS = CEK_GROUPED_THREADS;
    // The most threads a one-block-per-row launch takes (a row of BLOCK_SIZE elements): the
    // launcher's rule in cek/kernel.py, which the generated entry point checks against this.
    static constexpr int THREADS =
        STREAMED ? CEK_MAX_THREADS
                 : (ROW_CHUNKS / CHUNKS + CEK_WARP - 1) / CEK_WARP * CEK_WARP;
    // The most warps a block of this tiling has, rounded up to a power of two: the block
    // reduction's second shuffle levels (cek_block_sum).
    static constexpr int WARPS = cek_pow2_at_least(THREADS / CEK_WARP);
    // Blocks of 673..767 threads fit only two an SM (66-75% of its 2048 threads). Where a row
    // would take 704 or 736 (5377..5888 floats, BLOCK_SIZE 8192, 32 registers a thread) it
    // runs TAIL_THREADS, three an SM (98%), and each thread holds one element of the at most
    // MAX_TAIL past its chunks (cek_tail_element). Not for doubles: more than 32 registers a
    // thread hold them to two blocks of 672 anyway. Not for 16-bit rows either: two pairs a
    // thread, at most 512 threads.
    static constexpr bool TAILED = !STREAMED && sizeof(T) == 4 && BLOCK_SIZE == 8192;
    static constexpr int TAIL_THREADS = 672;
    static constexpr int MAX_TAIL = TAILED ? (736 - TAIL_THREADS) * CHUNKS * VEC : 0;
    static_assert(MAX_TAIL <= TAIL_THREADS, "a tailed row's thread holds one element at most");
};

// 16 bytes of a row: VEC elements, moved as one 128-bit access when aligned.
template <typename T>
struct alignas(16) CekChunk {
    union {
        T v[CekVec<T>::N];
        unsigned w[4];  // the same bytes as 32-bit words: 16-bit types convert two at a time
    };
};

// Squared norms and dot product, in the accumulation type.
template <typename Acc>
struct CekSums {
    Acc sq1, sq2, dot;
};

__device__ __forceinline__ bool cek_aligned16(const void* p) {
    return (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}

// Opens a branch that an ordinary row of an aligned tensor never takes (a misaligned view, a
// huge row): the rest of its scope, the body of an `if` or what follows an `if` that returns.
// The static report (cek/sass.py) reads the marker in this source and finds the code it marks by
// the line table (-lineinfo), not in the code. On the GPU it is still a `pmevent`, which only
// signals a profiler counter, on rare paths alone: compiled to nothing, it leaves the compiler
// free to move code across the rare branches, and the float fused kernel at BLOCK_SIZE 8192
// (sm_80, sm_90) and the float backward kernel at 4096 (sm_90) spill. Nothing on the CPU.
#ifdef __CUDA_ARCH__
#define CEK_RARE_PATH() asm volatile("pmevent 0;")
#else
#define CEK_RARE_PATH()
#endif

// 128-bit accesses need every row start 16-byte aligned: true for all rows exactly when the base
// pointers are and n_dim is a whole number of chunks. A view with an offset fails this and takes
// the scalar path.
template <typename T>
__device__ __forceinline__ bool cek_vectorizable(int n_dim, const void* a, const void* b,
                                                 const void* c, const void* d) {
    return n_dim % CekVec<T>::N == 0 && cek_aligned16(a) && cek_aligned16(b) &&
           cek_aligned16(c) && cek_aligned16(d);
}

// The same test without a branch: the pointers' OR, tested once. Its result stays in a predicate,
// where the branches of && meet in a bool held in a register. The fused kernel holds the flag
// through the block's reduction, and with a tailed row (CekTiling::TAILED) that register spilled
// on sm_90. The other kernels keep the && form: with this one ptxas gave their 16-bit variants
// more integer instructions (the forward bfloat16 kernel at D = 768: 51 against 43).
template <typename T>
__device__ __forceinline__ bool cek_vectorizable_flat(int n_dim, const void* a, const void* b,
                                                      const void* c, const void* d) {
    const unsigned long long bits =
        reinterpret_cast<unsigned long long>(a) | reinterpret_cast<unsigned long long>(b) |
        reinterpret_cast<unsigned long long>(c) | reinterpret_cast<unsigned long long>(d) |
        static_cast<unsigned long long>(n_dim % CekVec<T>::N);
    return (bits & 15ull) == 0;
}

// Elements past n_dim load as 0, which adds nothing to the sums.
template <typename T>
__device__ __forceinline__ CekChunk<T> cek_load_chunk(const T* __restrict__ row, int chunk,
                                                      int n_dim, bool vec) {
    constexpr int VEC = CekVec<T>::N;
    union {
        int4 raw;
        CekChunk<T> chunk;
    } u;
    const int k = chunk * VEC;
    if (vec) {
        // A select, not an early return: ptxas then loads into the registers the chunk lives
        // in; with a branch it may load elsewhere and copy, and the copy waits for the load.
        const int4 zero = make_int4(0, 0, 0, 0);
        u.raw = k < n_dim ? __ldg(reinterpret_cast<const int4*>(row) + chunk) : zero;
        return u.chunk;
    }
    u.raw = make_int4(0, 0, 0, 0);
    if (k >= n_dim) return u.chunk;
    CEK_RARE_PATH();  // a misaligned view, element by element
#pragma unroll
    for (int i = 0; i < VEC; ++i)
        if (k + i < n_dim) u.chunk.v[i] = row[k + i];
    return u.chunk;
}

// STREAM: a store the kernel will not read again, with the evict-first hint (st.global.cs):
// the split's gradient kernels store dx this way, so that it does not push out of L2 the slices
// of x1 and x2 their reverse walk has still to read (cosine_embedding_loss_split.cu).
template <bool STREAM = false, typename T>
__device__ __forceinline__ void cek_store_chunk(T* __restrict__ row, int chunk, int n_dim,
                                                bool vec, const CekChunk<T>& c) {
    constexpr int VEC = CekVec<T>::N;
    const int k = chunk * VEC;
    if (k >= n_dim) return;
    if (vec) {
        union {
            int4 raw;
            CekChunk<T> chunk;
        } u;
        u.chunk = c;
        if constexpr (STREAM)
            __stcs(reinterpret_cast<int4*>(row) + chunk, u.raw);
        else
            reinterpret_cast<int4*>(row)[chunk] = u.raw;
        return;
    }
    CEK_RARE_PATH();  // a misaligned view
#pragma unroll
    for (int i = 0; i < VEC; ++i)
        if (k + i < n_dim) row[k + i] = c.v[i];
}

// Sums over each aligned group of GROUP lanes of a warp. Every lane of the warp must call it
// (full mask): lanes of rows past n_rows take part with zeros.
template <int GROUP, typename Acc>
__device__ __forceinline__ CekSums<Acc> cek_group_sum(CekSums<Acc> v) {
    for (int offset = GROUP / 2; offset > 0; offset >>= 1) {
        v.sq1 += __shfl_xor_sync(0xffffffffu, v.sq1, offset);
        v.sq2 += __shfl_xor_sync(0xffffffffu, v.sq2, offset);
        v.dot += __shfl_xor_sync(0xffffffffu, v.dot, offset);
    }
    return v;
}

// Reduces over the block and gives every thread the totals. One barrier: each warp publishes its
// partials, then every warp reads them all at once (lane w takes warp w % WARPS's) and reduces
// them with shuffles: one shared-memory load and at most 15 shuffles per warp, where looping
// over up to 32 partials in every thread costs 96 loads per thread (a 1024-thread block issues
// ~3000 warp loads for a row it reads with 64). Every warp adds in the same tree order (an xor
// butterfly only commutes operands), so all threads hold the same bits, run after run. A second
// call must pass a barrier after the first: the shared array is not protected against reuse.
//
// WARPS, a power of two, bounds the block's warps at compile time (CekTiling::WARPS): each
// aligned group of WARPS lanes reads every partial, so log2(WARPS) shuffle levels give every
// lane the totals. Five levels over 32 lanes, the partials past the block's warps zeros, add
// the same numbers in the same order (a partial is never -0: its sums start at +0), and a block
// of at most four warps (a float row of 513..1024) paid three levels, 9 shuffles and 9 adds a
// thread, for nothing.
template <int WARPS = CEK_MAX_THREADS / CEK_WARP, typename Acc>
__device__ __forceinline__ CekSums<Acc> cek_block_sum(CekSums<Acc> v) {
    static_assert(WARPS >= 1 && WARPS <= CEK_WARP && (WARPS & (WARPS - 1)) == 0,
                  "WARPS must be a power of two of at most 32");
    v = cek_group_sum<CEK_WARP>(v);
    const int n_warps = blockDim.x / CEK_WARP;
    if (WARPS == 1 || n_warps == 1) return v;
    __shared__ CekSums<Acc> partial[CEK_MAX_THREADS / CEK_WARP];
    const int lane = threadIdx.x % CEK_WARP;
    if (lane == 0) partial[threadIdx.x / CEK_WARP] = v;
    __syncthreads();
    CekSums<Acc> total = {0, 0, 0};
    const int slot = lane % WARPS;
    if (slot < n_warps) total = partial[slot];
    return cek_group_sum<WARPS>(total);
}

// A chunk widened to the accumulation type; bfloat16 two at a time (CekType::to_acc2).
template <typename T>
__device__ __forceinline__ void cek_chunk_to_acc(const CekChunk<T>& c,
                                                 CekAcc<T> (&f)[CekVec<T>::N]) {
    constexpr int VEC = CekVec<T>::N;
    if constexpr (CekIsBf16<T>::value) {
#pragma unroll
        for (int i = 0; i < VEC / 2; ++i) CekType<T>::to_acc2(c.w[i], f[2 * i], f[2 * i + 1]);
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) f[i] = CekType<T>::to_acc(c.v[i]);
    }
}

// The same values by other instructions (16-bit types; others as cek_chunk_to_acc), for a
// gradient formed from chunks held through the block's reduction: widened as the sums widened
// them, ptxas keeps the sums' floats live through the reduction in place of the chunks, twice
// the registers (two 16-bit pairs a thread: 56 to 64 where the chunks fit 40).
template <typename T>
__device__ __forceinline__ void cek_chunk_to_acc_again(const CekChunk<T>& c,
                                                       CekAcc<T> (&f)[CekVec<T>::N]) {
    if constexpr (sizeof(T) == 2) {
#pragma unroll
        for (int i = 0; i < CekVec<T>::N / 2; ++i)
            CekType<T>::to_acc2_again(c.w[i], f[2 * i], f[2 * i + 1]);
    } else {
        cek_chunk_to_acc(c, f);
    }
}

// Adds a chunk pair to the sums, each value first multiplied by its scale (1, or a power of two
// for a rescaled row: exact unless it underflows, where it adds nothing the sums could show).
// AGAIN: the pair was summed before, and is widened again by other instructions.
template <bool SCALED = false, bool AGAIN = false, typename T>
__device__ __forceinline__ void cek_accumulate(CekSums<CekAcc<T>>& s, const CekChunk<T>& a,
                                               const CekChunk<T>& b, CekAcc<T> s1 = 1,
                                               CekAcc<T> s2 = 1) {
    CekAcc<T> xs[CekVec<T>::N], zs[CekVec<T>::N];
    if constexpr (AGAIN) {  // else ptxas keeps the first sums' floats for the second
        cek_chunk_to_acc_again(a, xs);
        cek_chunk_to_acc_again(b, zs);
    } else {
        cek_chunk_to_acc(a, xs);
        cek_chunk_to_acc(b, zs);
    }
#pragma unroll
    for (int i = 0; i < CekVec<T>::N; ++i) {
        CekAcc<T> x = xs[i], z = zs[i];
        if (SCALED) x *= s1, z *= s2;
        s.sq1 += x * x;
        s.sq2 += z * z;
        s.dot += x * z;
    }
}

// Huge rows. A squared norm of float32 overflows from |x| ~ 1e19 on, and long before that the
// gradient factor coeff*r1*r2 falls below the smallest normal float, which the GPU flushes to 0.
// A row whose sq1 or sq2 reaches CekLimits::BIG (the square root of the largest finite value) is
// summed again (row groups from registers; one block per row reads it again element by element,
// cek_block_huge_cosine) with that side scaled by a power of two: MID where its squared norm was
// finite (then in [1, BIG)), FAR where it overflowed (then at least 2^-32, and the elements this
// flushes add less than 2^-74 of it). c is unchanged and EPS is scaled alike
// (cek_scaled_cosine); the gradient is formed from scaled values read again and scaled back
// (cek_store_row_gradients, cek_element_gradients); where its factors p or q1 underflow even
// so, so does the exact gradient. Ordinary rows pay one uniform compare; a NaN
// or inf in a row takes the same branch and keeps its NaN.
template <typename Acc>
struct CekLimits;
template <>
struct CekLimits<float> {
    static constexpr float BIG = 18446744073709551616.0f, MAX = 3.40282346638528859812e38f,
                           MID = 2.3283064365386963e-10f,     // 2^-32
                           FAR = 8.271806125530277e-25f;      // 2^-80
};
template <>
struct CekLimits<double> {
    static constexpr double BIG = 1.3407807929942597e154, MAX = 1.7976931348623157e308,
                            MID = 8.636168555094445e-78,      // 2^-256
                            FAR = 2.6497349136889905e-169;    // 2^-560
};

template <typename Acc>
__device__ __forceinline__ bool cek_sums_ordinary(const CekSums<Acc>& s) {
    return s.sq1 < CekLimits<Acc>::BIG && s.sq2 < CekLimits<Acc>::BIG;
}

// Whether every lane of the warp has an ordinary row.
__device__ __forceinline__ bool cek_warp_ordinary(bool ordinary) {
    return __all_sync(0xffffffffu, ordinary);
}

template <typename Acc>
__device__ __forceinline__ Acc cek_scale_for(Acc sq) {
    using L = CekLimits<Acc>;
    return sq < L::BIG ? Acc(1) : sq <= L::MAX ? L::MID : L::FAR;
}

// One row of x1 and x2 held in registers: this lane's CHUNKS chunks, in storage type.
template <int CHUNKS, typename T>
struct CekRowPair {
    CekChunk<T> a[CHUNKS];  // x1
    CekChunk<T> b[CHUNKS];  // x2
};

// Loads chunks first, first + step, ... of x1 into a and of x2 into b, every load issued before
// any value is used. The alignment test is made once for all N pairs, not per chunk: two paths
// per chunk meet in registers that ptxas may fill with a copy of the loaded ones, and a copy
// waits for its load, so the next chunk's load would issue one memory round trip later.
template <int N, typename T>
__device__ __forceinline__ void cek_load_pairs(CekChunk<T> (&a)[N], CekChunk<T> (&b)[N],
                                               const T* __restrict__ x1,
                                               const T* __restrict__ x2, int first, int step,
                                               int n_dim, bool vec) {
    if (vec) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            a[i] = cek_load_chunk(x1, first + i * step, n_dim, true);
            b[i] = cek_load_chunk(x2, first + i * step, n_dim, true);
        }
        return;
    }
    CEK_RARE_PATH();  // a misaligned view
#pragma unroll
    for (int i = 0; i < N; ++i) {
        a[i] = cek_load_chunk(x1, first + i * step, n_dim, false);
        b[i] = cek_load_chunk(x2, first + i * step, n_dim, false);
    }
}

// Loads this lane's chunks of a row and returns its partial sums. Every load is issued before
// the first value is used: one round trip to memory per row, however many chunks.
template <int CHUNKS, typename T>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_load_row_pair(
    CekRowPair<CHUNKS, T>& rp, const T* __restrict__ x1, const T* __restrict__ x2, int n_dim,
    bool vec, int lane, int lanes) {
    cek_load_pairs(rp.a, rp.b, x1, x2, lane, lanes, n_dim, vec);
    CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) cek_accumulate(s, rp.a[i], rp.b[i]);
    return s;
}

// This lane's partial sums of a row in registers, its values scaled by s1 and s2.
template <int CHUNKS, typename T>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_row_pair_scaled_sums(
    const CekRowPair<CHUNKS, T>& rp, CekAcc<T> s1, CekAcc<T> s2) {
    CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i)  // widened again where lanes hold pairs (registers)
        cek_accumulate<true, (CHUNKS >= 2)>(s, rp.a[i], rp.b[i], s1, s2);
    return s;
}

// The streamed path's partial sums: the block loops over the row, each thread with four chunk
// pairs in flight (all four issued, then summed), as one pair a trip would leave it waiting on
// memory for every 32 bytes. (A huge row is summed again by cek_block_huge_cosine.)
constexpr int CEK_STREAM_UNROLL = 4;

template <typename T>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_stream_row_sums(const T* __restrict__ x1,
                                                                   const T* __restrict__ x2,
                                                                   int n_dim, bool vec) {
    constexpr int U = CEK_STREAM_UNROLL;
    CekSums<CekAcc<T>> s = {0, 0, 0};
    const int n_chunks = (n_dim + CekVec<T>::N - 1) / CekVec<T>::N;
    const int stride = blockDim.x;
    int chunk = threadIdx.x;
    for (; chunk + (U - 1) * stride < n_chunks; chunk += U * stride) {
        CekChunk<T> a[U], b[U];
        cek_load_pairs(a, b, x1, x2, chunk, stride, n_dim, vec);
#pragma unroll
        for (int u = 0; u < U; ++u) cek_accumulate(s, a[u], b[u]);
    }
    for (; chunk < n_chunks; chunk += stride)
        cek_accumulate(s, cek_load_chunk(x1, chunk, n_dim, vec),
                       cek_load_chunk(x2, chunk, n_dim, vec));
    return s;
}

// c, r1, r2 of a row from its sums; s1, s2 the scales its sums were taken with (1: ordinary).
template <typename Acc>
struct CekCosine {
    Acc c, r1, r2;
    Acc s1 = 1, s2 = 1;
};

template <typename Acc>
__device__ __forceinline__ CekCosine<Acc> cek_cosine(CekSums<Acc> s) {
    CekCosine<Acc> k;
    k.r1 = cek_rsqrt(s.sq1 + Acc(CEK_EPS));
    k.r2 = cek_rsqrt(s.sq2 + Acc(CEK_EPS));
    k.c = s.dot * k.r1 * k.r2;
    return k;
}

// The same for sums of values scaled by s1 and s2: EPS scales with the squared norm, so r1 and r2
// are those of the unscaled row divided by s1 and s2, and c is the row's (cek_scale_for).
template <typename Acc>
__device__ __forceinline__ CekCosine<Acc> cek_scaled_cosine(CekSums<Acc> s, Acc s1, Acc s2) {
    CekCosine<Acc> k;
    k.r1 = cek_rsqrt(s.sq1 + Acc(CEK_EPS) * s1 * s1);
    k.r2 = cek_rsqrt(s.sq2 + Acc(CEK_EPS) * s2 * s2);
    k.c = s.dot * k.r1 * k.r2;
    k.s1 = s1;
    k.s2 = s2;
    return k;
}

// dx1 = coeff*(x2*r2 - c*x1*r1)*r1 and dx2 = coeff*(x1*r1 - c*x2*r2)*r2 for one chunk, expanded
// as p*x2 - q1*x1 and p*x1 - q2*x2 (fewer multiplies per element). With coeff == 0 every element
// is still written: 0 for finite inputs, NaN where the row has a NaN. A rescaled row (s1, s2 not
// 1) has r1, r2 of the scaled values: dx1 = s1*(p*x2' - q1*x1') with x' = x*s, and so on.
template <typename Acc>
struct CekGradient {
    Acc p, q1, q2;
    Acc s1, s2;
};

template <typename Acc>
__device__ __forceinline__ CekGradient<Acc> cek_gradient(CekCosine<Acc> k, Acc coeff) {
    return {coeff * k.r1 * k.r2, coeff * k.c * k.r1 * k.r1, coeff * k.c * k.r2 * k.r2, k.s1,
            k.s2};
}

template <typename Acc>
__device__ __forceinline__ bool cek_rescaled(const CekGradient<Acc>& g) {
    return g.s1 != Acc(1) || g.s2 != Acc(1);
}

// A chunk of values in the accumulation type rounded to T: 16-bit types two at a time.
template <typename T>
__device__ __forceinline__ CekChunk<T> cek_chunk_from_acc(const CekAcc<T> (&f)[CekVec<T>::N]) {
    constexpr int VEC = CekVec<T>::N;
    if constexpr (sizeof(T) == 2) {
        CekChunk<T> c;
#pragma unroll
        for (int i = 0; i < VEC / 2; ++i) c.w[i] = CekType<T>::from_acc2(f[2 * i], f[2 * i + 1]);
        return c;
    } else {
        CekChunk<T> c;
#pragma unroll
        for (int i = 0; i < VEC; ++i) c.v[i] = CekType<T>::from_acc(f[i]);
        return c;
    }
}

// AGAIN: a and b were held through the block's reduction, two pairs a thread or more; their
// values are widened again by other instructions (cek_chunk_to_acc_again).
template <bool SCALED = false, bool AGAIN = false, typename T>
__device__ __forceinline__ void cek_store_chunk_gradients(T* __restrict__ dx1,
                                                          T* __restrict__ dx2, int chunk,
                                                          int n_dim, bool vec,
                                                          CekGradient<CekAcc<T>> g,
                                                          const CekChunk<T>& a,
                                                          const CekChunk<T>& b) {
    CekAcc<T> d1[CekVec<T>::N], d2[CekVec<T>::N], xs[CekVec<T>::N], zs[CekVec<T>::N];
    if constexpr (AGAIN) {
        cek_chunk_to_acc_again(a, xs);
        cek_chunk_to_acc_again(b, zs);
    } else {
        cek_chunk_to_acc(a, xs);
        cek_chunk_to_acc(b, zs);
    }
#pragma unroll
    for (int i = 0; i < CekVec<T>::N; ++i) {
        CekAcc<T> x = xs[i], z = zs[i];
        if (SCALED) {
            x *= g.s1, z *= g.s2;
            d1[i] = g.s1 * (g.p * z - g.q1 * x);
            d2[i] = g.s2 * (g.p * x - g.q2 * z);
        } else {
            d1[i] = g.p * z - g.q1 * x;
            d2[i] = g.p * x - g.q2 * z;
        }
    }
    cek_store_chunk(dx1, chunk, n_dim, vec, cek_chunk_from_acc<T>(d1));
    cek_store_chunk(dx2, chunk, n_dim, vec, cek_chunk_from_acc<T>(d2));
}

// Writes this lane's chunks of the gradient from registers. A rescaled row reads x1 and x2
// again instead: in that branch rp is then dead, which keeps the scaled arithmetic from
// costing registers (and spills) on the ordinary path; only huge rows pay the second read.
template <int CHUNKS, typename T>
__device__ __forceinline__ void cek_store_row_gradients(const CekRowPair<CHUNKS, T>& rp,
                                                        const T* __restrict__ x1,
                                                        const T* __restrict__ x2,
                                                        T* __restrict__ dx1, T* __restrict__ dx2,
                                                        int n_dim, bool vec, int lane, int lanes,
                                                        CekGradient<CekAcc<T>> g) {
    if (cek_rescaled(g)) {
        CEK_RARE_PATH();  // a huge row
#pragma unroll 1
        for (int i = 0; i < CHUNKS; ++i) {
            const int chunk = lane + i * lanes;
            cek_store_chunk_gradients<true>(dx1, dx2, chunk, n_dim, vec, g,
                                            cek_load_chunk(x1, chunk, n_dim, vec),
                                            cek_load_chunk(x2, chunk, n_dim, vec));
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i)
        cek_store_chunk_gradients<false, (CHUNKS >= 2)>(dx1, dx2, lane + i * lanes, n_dim, vec, g,
                                                        rp.a[i], rp.b[i]);
}

// The streamed path's gradient: the second read of the row (counted in the bytes formula).
// Backwards from this thread's last chunk: the end of the row, read last by the sums, is the
// part most likely still in L2. Four chunk pairs in flight a trip, as in the sums; two in a
// 16-bit type, whose conversions four would spill (at 1024 threads a thread has 64 registers;
// the fused kernel spilled 34 bytes on sm_80, the backward 8). A huge row's gradient is
// cek_element_gradients.
template <typename T>
__device__ __forceinline__ void cek_stream_row_gradients_pass(const T* __restrict__ x1,
                                                              const T* __restrict__ x2,
                                                              T* __restrict__ dx1,
                                                              T* __restrict__ dx2, int n_dim,
                                                              bool vec, CekGradient<CekAcc<T>> g) {
    constexpr int U = sizeof(T) == 2 ? CEK_STREAM_UNROLL / 2 : CEK_STREAM_UNROLL;
    const int n_chunks = (n_dim + CekVec<T>::N - 1) / CekVec<T>::N;
    const int first = threadIdx.x, stride = blockDim.x;
    int chunk = first < n_chunks ? first + (n_chunks - 1 - first) / stride * stride : -1;
    for (; chunk - (U - 1) * stride >= first; chunk -= U * stride) {
        CekChunk<T> a[U], b[U];
        cek_load_pairs(a, b, x1, x2, chunk, -stride, n_dim, vec);
#pragma unroll
        for (int u = 0; u < U; ++u)
            cek_store_chunk_gradients(dx1, dx2, chunk - u * stride, n_dim, vec, g, a[u], b[u]);
    }
    for (; chunk >= first; chunk -= stride)
        cek_store_chunk_gradients(dx1, dx2, chunk, n_dim, vec, g,
                                  cek_load_chunk(x1, chunk, n_dim, vec),
                                  cek_load_chunk(x2, chunk, n_dim, vec));
}

// Loss of one row: 1 - c for y == 1, max(0, c - margin) for y == -1, 0 for any other label.
// Written so that a NaN c gives NaN for y == +-1 (fmax would turn it into 0).
template <typename Acc>
__device__ __forceinline__ Acc cek_row_loss(Acc c, Acc y, Acc margin) {
    if (y == Acc(1)) return Acc(1) - c;
    if (y == Acc(-1)) return c <= margin ? Acc(0) : c - margin;
    return Acc(0);
}

// The upstream gradient of a row, before the reduction's scale: the gradient kernels take dy in
// the inputs' type T (torch's gradient of a loss of that type, read as it comes: no cast is
// launched first), dy_stride 1 for one value a row and 0 for one value for every row (a mean's
// or a sum's 0-d gradient, read in place: no expand). Loaded as T and widened where it is used,
// after the row's sums: a conversion right after the load waited for it before the row's loads
// went out (two load rounds in the 16-bit backward kernels).
template <typename T>
__device__ __forceinline__ T cek_upstream(const T* __restrict__ dy, int dy_stride, int row) {
    return dy[row * dy_stride];  // dy_stride is 0 or 1: row * dy_stride < 2^31
}

// The same where dy may be nullptr, which stands for an upstream gradient of 1 (the fused
// kernels': cek.torch's training step computes the gradients of a mean's or a sum's 1). The
// backward kernels take a dy always: the test for nullptr cost the tailed bfloat16 backward
// kernel a register (12 bytes spilled at 32 registers on sm_90).
template <typename T>
__device__ __forceinline__ T cek_upstream_or_one(const T* __restrict__ dy, int dy_stride,
                                                 int row) {
    return dy == nullptr ? CekType<T>::one() : cek_upstream(dy, dy_stride, row);
}

// A row's loss, by the one thread that writes it, into what the caller gave (each may be
// nullptr): in the accumulation type (what a reduction reads) and in the inputs' type
// (reduction "none"'s result).
template <typename T>
__device__ __forceinline__ void cek_store_row_loss(CekAcc<T>* __restrict__ loss,
                                                   T* __restrict__ loss_out, int row,
                                                   CekAcc<T> row_loss) {
    if (loss != nullptr) loss[row] = row_loss;
    if (loss_out != nullptr) loss_out[row] = CekType<T>::from_acc(row_loss);
}

// A value of an element type in its accumulation type (a value already in it stays as it is).
template <typename V>
__device__ __forceinline__ CekAcc<V> cek_widen(V v) {
    return CekType<V>::to_acc(v);
}

// coeff = d loss / d c times the upstream gradient g.
template <typename Acc>
__device__ __forceinline__ Acc cek_row_coeff(Acc c, Acc y, Acc margin, Acc g) {
    if (y == Acc(1)) return -g;
    if (y == Acc(-1) && c > margin) return g;
    return Acc(0);
}

// A compile-time choice handed to a generic lambda (cek_block_row's `finish`).
template <bool B>
struct CekFlag {
    static constexpr bool value = B;
};

// A huge row (or one with a NaN) on the one-block-per-row paths: summed again rescaled and its
// gradient written, each read again from memory element by element (coalesced across the
// block). Registers, not speed, decide this code: it is compiled beside the ordinary path, and
// what it holds live the ordinary path pays for too. Summed from rp (as row groups do) or a
// chunk at a time, it cost a 1024-thread block of two float chunk pairs a thread 47 registers
// where the ordinary path fits 32 (one block per SM instead of two). Only huge rows pay the read.
template <typename T>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_element_sums(const T* __restrict__ x1,
                                                                const T* __restrict__ x2,
                                                                int n_dim, CekAcc<T> s1,
                                                                CekAcc<T> s2) {
    CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll 1
    for (int i = threadIdx.x; i < n_dim; i += blockDim.x) {
        const CekAcc<T> x = CekType<T>::to_acc(x1[i]) * s1, z = CekType<T>::to_acc(x2[i]) * s2;
        s.sq1 += x * x;
        s.sq2 += z * z;
        s.dot += x * z;
    }
    return s;
}

template <typename T>
__device__ __forceinline__ void cek_element_gradients(const T* __restrict__ x1,
                                                      const T* __restrict__ x2,
                                                      T* __restrict__ dx1, T* __restrict__ dx2,
                                                      int n_dim, CekGradient<CekAcc<T>> g) {
#pragma unroll 1
    for (int i = threadIdx.x; i < n_dim; i += blockDim.x) {
        const CekAcc<T> x = CekType<T>::to_acc(x1[i]) * g.s1,
                        z = CekType<T>::to_acc(x2[i]) * g.s2;
        dx1[i] = CekType<T>::from_acc(g.s1 * (g.p * z - g.q1 * x));
        dx2[i] = CekType<T>::from_acc(g.s2 * (g.p * x - g.q2 * z));
    }
}

// WARPS: the block's cek_block_sum bound, the same as the ordinary path's, so that both share
// one array of partials in shared memory (each bound is an array of its own).
template <int WARPS, typename T>
__device__ __forceinline__ CekCosine<CekAcc<T>> cek_block_huge_cosine(CekSums<CekAcc<T>> s,
                                                                      const T* __restrict__ x1,
                                                                      const T* __restrict__ x2,
                                                                      int n_dim) {
    const CekAcc<T> s1 = cek_scale_for(s.sq1), s2 = cek_scale_for(s.sq2);
    s = cek_element_sums(x1, x2, n_dim, s1, s2);
    __syncthreads();  // every warp has read the first sums' partials
    return cek_scaled_cosine(cek_block_sum<WARPS>(s), s1, s2);
}

// A tailed row's elements past the chunks (CekTiling::TAILED): thread t holds element
// CHUNKS * VEC * blockDim.x + t of x1 and x2, if the row has it. An element, not a third chunk
// pair: two more registers where a chunk pair would take 8 or 16 past the 32 that three blocks
// an SM allow; a warp's 32 elements are still one 128-byte line. Between the sums and the
// gradient the pair waits in shared memory, widened to the accumulation type: kept in registers
// through the block reduction it made the float gradient kernels spill, stored as 16-bit values
// the bfloat16 backward kernel. Each thread reads back only its own pair: no barrier.
template <typename Acc>
struct CekTailPair {
    Acc x, z;
};

template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ CekTailPair<CekAcc<T>>& cek_tail_pair() {
    __shared__ CekTailPair<CekAcc<T>> pairs[CekTiling<BLOCK_SIZE, T>::TAIL_THREADS];
    return pairs[threadIdx.x];
}

template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ int cek_tail_element() {
    return CekTiling<BLOCK_SIZE, T>::CHUNKS * CekVec<T>::N * blockDim.x + threadIdx.x;
}

// The register path's loads and sums of this thread's part of a row, a tailed row's element
// included, its loads issued after the chunks' (issued before them, the element was widened
// before the chunk loads went out: two load rounds).
template <int BLOCK_SIZE, typename T, typename Loaded>
__device__ __forceinline__ CekSums<CekAcc<T>> cek_load_block_row(
    CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T>& rp, const T* __restrict__ x1,
    const T* __restrict__ x2, int n_dim, bool vec, Loaded loaded) {
    if constexpr (!CekTiling<BLOCK_SIZE, T>::TAILED) {
        cek_load_pairs(rp.a, rp.b, x1, x2, threadIdx.x, blockDim.x, n_dim, vec);
        loaded();
        CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll
        for (int i = 0; i < CekTiling<BLOCK_SIZE, T>::CHUNKS; ++i)
            cek_accumulate(s, rp.a[i], rp.b[i]);
        return s;
    } else {
        cek_load_pairs(rp.a, rp.b, x1, x2, threadIdx.x, blockDim.x, n_dim, vec);
        const int k = cek_tail_element<BLOCK_SIZE, T>();
        const T zero = CekType<T>::from_acc(0);
        const T a = k < n_dim ? x1[k] : zero, b = k < n_dim ? x2[k] : zero;
        loaded();
        CekSums<CekAcc<T>> s = {0, 0, 0};
#pragma unroll
        for (int i = 0; i < CekTiling<BLOCK_SIZE, T>::CHUNKS; ++i)
            cek_accumulate(s, rp.a[i], rp.b[i]);
        const CekAcc<T> x = CekType<T>::to_acc(a), z = CekType<T>::to_acc(b);
        s.sq1 += x * x;
        s.sq2 += z * z;
        s.dot += x * z;
        if (k < n_dim) cek_tail_pair<BLOCK_SIZE, T>() = {x, z};
        return s;
    }
}

// This block's row: loads it (into rp on the register path; the streamed path loops over it),
// finds its cosine and returns finish(k, CekFlag<HUGE>{}). finish is inlined twice, once for
// ordinary rows and once, behind CEK_RARE_PATH, for huge ones, so the ordinary path's code and
// registers are its own: nothing of the huge branch joins it. The branch is uniform: every
// thread holds the same sums.
//
// loaded() runs once the row's loads are issued and before any loaded value is used (on the
// streamed path, once the row's first pass is summed): for work that waits on something loaded
// with them, such as the fused kernel's copy of the label, which placed anywhere else held a
// register through the row's work or made the thread wait before issuing the row's loads.
//
struct CekNothing {
    __device__ __forceinline__ void operator()() const {}
};

template <int BLOCK_SIZE, typename T, typename Finish, typename Loaded = CekNothing>
__device__ __forceinline__ auto cek_block_row(CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T>& rp,
                                              const T* __restrict__ x1,
                                              const T* __restrict__ x2, int n_dim, bool vec,
                                              Finish finish, Loaded loaded = {}) {
    CekSums<CekAcc<T>> s;
    if constexpr (CekTiling<BLOCK_SIZE, T>::STREAMED) {
        s = cek_stream_row_sums(x1, x2, n_dim, vec);
        loaded();  // after the loop: before it, warp 0 issued its first loads a round late
    } else {
        s = cek_load_block_row<BLOCK_SIZE>(rp, x1, x2, n_dim, vec, loaded);
    }
    s = cek_block_sum<CekTiling<BLOCK_SIZE, T>::WARPS>(s);
    if (cek_sums_ordinary(s)) return finish(cek_cosine(s), CekFlag<false>{});
    CEK_RARE_PATH();  // a huge row
    return finish(cek_block_huge_cosine<CekTiling<BLOCK_SIZE, T>::WARPS>(s, x1, x2, n_dim),
                  CekFlag<true>{});
}

// Writes this block's row of dx1, dx2: from registers, or read again on the streamed path and
// for a huge row (rescaled, element by element: cek_element_gradients).
template <bool HUGE, int BLOCK_SIZE, typename T>
__device__ __forceinline__ void cek_block_row_gradients(
    const CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T>& rp, const T* __restrict__ x1,
    const T* __restrict__ x2, T* __restrict__ dx1, T* __restrict__ dx2, int n_dim, bool vec,
    CekGradient<CekAcc<T>> g) {
    if constexpr (HUGE) {
        cek_element_gradients(x1, x2, dx1, dx2, n_dim, g);
    } else if constexpr (CekTiling<BLOCK_SIZE, T>::STREAMED) {
        cek_stream_row_gradients_pass(x1, x2, dx1, dx2, n_dim, vec, g);
    } else {
        // Widened again where the registers this saves buy blocks: not in blocks of 1024
        // threads, one an SM either way (16-bit rows of 16384, where it cost 45 instructions).
        constexpr bool AGAIN = CekTiling<BLOCK_SIZE, T>::CHUNKS >= 2 &&
                               CekTiling<BLOCK_SIZE, T>::THREADS < CEK_MAX_THREADS;
#pragma unroll
        for (int i = 0; i < CekTiling<BLOCK_SIZE, T>::CHUNKS; ++i)
            cek_store_chunk_gradients<false, AGAIN>(dx1, dx2, threadIdx.x + i * blockDim.x, n_dim,
                                                    vec, g, rp.a[i], rp.b[i]);
        if constexpr (CekTiling<BLOCK_SIZE, T>::TAILED) {
            const int k = cek_tail_element<BLOCK_SIZE, T>();
            if (k < n_dim) {
                const CekTailPair<CekAcc<T>> t = cek_tail_pair<BLOCK_SIZE, T>();
                const CekAcc<T> x = t.x, z = t.z;
                dx1[k] = CekType<T>::from_acc(g.p * z - g.q1 * x);
                dx2[k] = CekType<T>::from_acc(g.p * x - g.q2 * z);
            }
        }
    }
}

// Row groups: GROUP lanes of one warp own a row, blockDim.x / GROUP rows a block (cek_row.cuh's
// tiling comment). The lanes of rows past n_rows take part in the shuffles with zeros, so every
// lane calls this; a caller returns for !live rows only afterwards.
template <int BLOCK_SIZE, typename T>
struct CekGroupRow {
    using Tiling = CekTiling<BLOCK_SIZE, T>;
    int row, lane;
    bool live;
    long long offset;  // 64-bit: n_rows * n_dim may exceed 2^31
    CekRowPair<Tiling::GROUP_CHUNKS, T> rp;
    CekCosine<CekAcc<T>> k;
};

// This lane's row of a row group, `row` (live: a row to compute; the lanes of a group that is
// not live take part in the shuffles with zeros). The caller loads the row's labels with r.row
// before the row itself (cek_group_row_cosine), so that both are in flight together.
template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ CekGroupRow<BLOCK_SIZE, T> cek_group_row_at(int row, bool live,
                                                                       int n_dim) {
    static_assert(CekTiling<BLOCK_SIZE, T>::GROUPED,
                  "row groups need rows of at most 64 chunks, 256 elements (1024 in 16 bits)");
    CekGroupRow<BLOCK_SIZE, T> r;
    r.lane = threadIdx.x % CekTiling<BLOCK_SIZE, T>::GROUP;
    r.row = row;
    r.live = live;
    r.offset = live ? static_cast<long long>(row) * n_dim : 0;
    return r;
}

// The row of this lane's group where block b holds rows b * (blockDim.x / GROUP) onwards.
template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ CekGroupRow<BLOCK_SIZE, T> cek_group_row(int n_rows, int n_dim) {
    constexpr int GROUP = CekTiling<BLOCK_SIZE, T>::GROUP;
    // Below 2^31: the grid's rows, ceil(n_rows / R) * R for R a power of two, are at most 2^31
    // for n_rows < 2^31 (tests/test_large_offsets.py runs the last blocks at 2^31 - 100 rows).
    const int row = blockIdx.x * (blockDim.x / GROUP) + threadIdx.x / GROUP;
    return cek_group_row_at<BLOCK_SIZE, T>(row, row < n_rows, n_dim);
}

// Loads r's row and finds its cosine, rescaled as cek_block_row_cosine does for a row that is
// not ordinary. The shuffles take the whole warp, so the second sums run whenever a row of the
// warp needs them; an ordinary row's scales are 1 and its sums come out the same.
template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ void cek_group_row_cosine(CekGroupRow<BLOCK_SIZE, T>& r,
                                                     const T* __restrict__ x1,
                                                     const T* __restrict__ x2, int n_dim,
                                                     bool vec) {
    using Acc = CekAcc<T>;
    constexpr int GROUP = CekTiling<BLOCK_SIZE, T>::GROUP;
    auto s = cek_load_row_pair(r.rp, x1 + r.offset, x2 + r.offset, r.live ? n_dim : 0, vec,
                               r.lane, GROUP);
    s = cek_group_sum<GROUP>(s);
    if (cek_warp_ordinary(cek_sums_ordinary(s))) {
        r.k = cek_cosine(s);
        return;
    }
    CEK_RARE_PATH();  // a huge row in the warp
    const Acc s1 = cek_scale_for(s.sq1), s2 = cek_scale_for(s.sq2);
    r.k = cek_scaled_cosine(cek_group_sum<GROUP>(cek_row_pair_scaled_sums(r.rp, s1, s2)), s1, s2);
}
