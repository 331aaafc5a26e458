// cosine_embedding_loss_reduce: the mean or the sum of the per-row losses, in a fixed order.
//
// Math, over loss [n_rows] (the per-row losses the fused or forward-rows kernel wrote, in Acc =
// double for double, float otherwise):
//   reduced[0] = T(scale * sum_r loss[r])   mean: scale = 1/n_rows; sum: scale = 1
// summed in Acc, rounded to T once (T = float, double, cek_f16 or cek_bf16: x1's type).
// The order of the additions is the code's alone, so the bits are the same run after run and on
// every GPU: the losses are cut into 16-byte chunks (4 floats, 2 doubles); thread t adds the
// elements of chunks t, t + BLOCK_SIZE, t + 2*BLOCK_SIZE, ... in that order into one
// accumulator (the chunk past the last whole one holds the n_rows % VEC last losses, and zeros);
// then a fixed butterfly adds the 32 sums of each warp, and another the 32 warp sums in warp 0.
// An aligned loss is read 128 bits at a time, any other element by element, in the same order.
//
// Two levels, for many rows: with `partials` given, block b adds the slice
// [b*SLICE, min(n_rows, (b+1)*SLICE)) in that same order, as if it were the whole loss, and
// writes the unscaled Acc sum to partials[b] (SLICE = CEK_REDUCE_CHUNKS * 1024 * VEC losses:
// one trip a thread, 32768 floats, 16384 doubles); a second launch without partials then
// reduces partials [blocks] with the scale. Each slice and each sum is fixed by n_rows alone,
// so the bits still are; no block waits on another (no fence, no atomic, no counter).
//
// Launch contract: block [BLOCK_SIZE, 1, 1], BLOCK_SIZE = 1024; grid [1, 1, 1] without
// partials (n_rows >= 0; no rows: scale * 0), grid [ceil(n_rows / SLICE), 1, 1] with them
// (n_rows >= 1; `reduced` and `scale` unused). Each thread has CEK_REDUCE_CHUNKS chunks in
// flight a trip (128 bytes, 128 KB a block: 32768 floats), so a mean over 65536 float losses
// is two trips of loads in one block; above that the launchers run the two levels, one trip
// a block and then one trip for the partials (to 2^30 rows).
//
// Bytes moved (S = sizeof(T), A = sizeof(Acc), G = blocks of the first level, 0 for one
// launch): read loss once, write and read the partials once, write reduced: A*N + 2*A*G + S.
// cek_row.cuh: CEK_RARE_PATH() (cek_chunk.cuh) marks the misaligned fallback for the static report.
#include "cek_row.cuh"

constexpr int CEK_REDUCE_THREADS = 1024;
constexpr int CEK_REDUCE_CHUNKS = 8;  // chunk loads a thread issues before it adds one

// Losses a block of the first level adds: one trip of every thread.
template <typename Acc>
constexpr int cek_reduce_slice() {
    return CEK_REDUCE_CHUNKS * CEK_REDUCE_THREADS * CekVec<Acc>::N;
}

template <typename Acc>
struct alignas(16) CekLossChunk {
    Acc v[CekVec<Acc>::N];
};

// Chunk `chunk` of the losses if it is below `chunks` (a whole chunk), else zeros. A select,
// not a branch: the loaded registers are then the chunk's own (as in cek_load_chunk).
template <bool VECTORIZED, typename Acc>
__device__ __forceinline__ CekLossChunk<Acc> cek_load_losses(const Acc* __restrict__ loss,
                                                             long long chunk, long long chunks) {
    union {
        int4 raw;
        CekLossChunk<Acc> c;
    } u;
    if constexpr (VECTORIZED) {
        const int4 zero = make_int4(0, 0, 0, 0);
        u.raw = chunk < chunks ? __ldg(reinterpret_cast<const int4*>(loss) + chunk) : zero;
    } else {
#pragma unroll
        for (int i = 0; i < CekVec<Acc>::N; ++i)
            u.c.v[i] = chunk < chunks ? loss[chunk * CekVec<Acc>::N + i] : Acc(0);
    }
    return u.c;
}

// This thread's sum of the whole chunks t, t + BLOCK_SIZE, ... below `chunks`: a trip issues the
// loads of CEK_REDUCE_CHUNKS chunks, then adds them in chunk order. A chunk past the end adds
// zeros, which leave a sum as it is. One instantiation per load width, chosen once by the
// caller: where a 128-bit and a scalar path meet inside the trip, ptxas copies the loaded
// registers, and a copy waits for its load (docs/design.md, "One load round per row").
template <bool VECTORIZED, typename Acc>
__device__ __forceinline__ Acc cek_thread_losses(const Acc* __restrict__ loss, long long chunks) {
    constexpr int STRIDE = CEK_REDUCE_THREADS;
    Acc sum = 0;
    for (long long first = threadIdx.x; first < chunks; first += CEK_REDUCE_CHUNKS * STRIDE) {
        CekLossChunk<Acc> c[CEK_REDUCE_CHUNKS];
#pragma unroll
        for (int u = 0; u < CEK_REDUCE_CHUNKS; ++u) {
            c[u] = cek_load_losses<VECTORIZED>(loss, first + u * STRIDE, chunks);
        }
#pragma unroll
        for (int u = 0; u < CEK_REDUCE_CHUNKS; ++u)
#pragma unroll
            for (int i = 0; i < CekVec<Acc>::N; ++i) sum += c[u].v[i];
    }
    return sum;
}

// The sum of v over the block, in thread 0: a fixed butterfly in each warp, then one over the
// warps' sums in warp 0.
template <typename Acc>
__device__ __forceinline__ Acc cek_block_total(Acc v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    __shared__ Acc warp_sums[CEK_REDUCE_THREADS / 32];
    const int lane = threadIdx.x % 32;
    if (lane == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    v = warp_sums[lane];  // every warp reads them; warp 0's sum is the one written
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_reduce(const CekAcc<T>* __restrict__ loss,
                                             T* __restrict__ reduced, int n_rows,
                                             CekAcc<T> scale, CekAcc<T>* __restrict__ partials) {
    static_assert(BLOCK_SIZE == CEK_REDUCE_THREADS, "blocks of 1024 threads");
    using Acc = CekAcc<T>;
    constexpr int VEC = CekVec<Acc>::N;
    constexpr int SLICE = cek_reduce_slice<Acc>();
    static_assert(SLICE % VEC == 0, "a slice keeps a 16-byte aligned loss aligned");
    int n = n_rows;
    if (partials != nullptr) {  // this block's slice, as a loss array of its own
        const long long first = static_cast<long long>(blockIdx.x) * SLICE;
        loss += first;
        n = n_rows - first < SLICE ? static_cast<int>(n_rows - first) : SLICE;
    }
    const long long whole = n / VEC;
    const bool vec = (reinterpret_cast<unsigned long long>(loss) & 15ull) == 0;
    Acc sum;
    if (vec) {
        sum = cek_thread_losses<true>(loss, whole);
    } else {
        CEK_RARE_PATH();  // a loss that is not 16-byte aligned, read element by element
        sum = cek_thread_losses<false>(loss, whole);
    }
    // The chunk of the last n % VEC losses comes last in its thread's order, as if whole.
    if (threadIdx.x == whole % BLOCK_SIZE && n % VEC != 0) {
        CekLossChunk<Acc> c = {};
        for (int i = 0; i < n % VEC; ++i) c.v[i] = loss[whole * VEC + i];
#pragma unroll
        for (int i = 0; i < VEC; ++i) sum += c.v[i];
    }
    sum = cek_block_total(sum);
    if (threadIdx.x != 0) return;
    if (partials != nullptr)
        partials[blockIdx.x] = sum;  // unscaled: the second level scales the total once
    else
        *reduced = CekType<T>::from_acc(scale * sum);
}
