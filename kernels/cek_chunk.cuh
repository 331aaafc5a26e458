// cek_chunk.cuh: 16-byte chunks of a row: loads and stores (CEK_RARE_PATH marks the
// misaligned ones), conversions to and from the accumulation type, a row pair's loads.
#pragma once

#include "cek_types.cuh"

// 16 bytes of a row: VEC elements, moved as one 128-bit access when aligned.
template <typename T>
struct alignas(16) CekChunk {
    union {
        T v[CekVec<T>::N];
        unsigned w[4];  // the same bytes as 32-bit words: 16-bit types convert two at a time
    };
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
