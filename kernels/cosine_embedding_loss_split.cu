// cosine_embedding_loss_split: few wide rows over many blocks, in two launches.
//
// Math: the forward, backward and fused kernels' (their headers), per row r of x1, x2
// [n_rows, n_dim] (T = float, double, cek_f16 or cek_bf16; Acc = double for double, float
// otherwise). A row is cut into S = ceil(n_dim / SLICE) slices, slice s = elements
// [s*SLICE, min(n_dim, (s+1)*SLICE)), SLICE = 1024 threads x one 16-byte chunk: 4096 floats,
// 8192 16-bit values, 2048 doubles. S depends on n_dim alone, so the order of every addition,
// and the bits, depend on n_dim and the inputs.
//
//   _sums (first launch): block b reads slices 2b and 2b + 1 of the N*S (slice s of row r is
//     r*S + s) once, all its loads in flight together, and writes sums[r*S + s] = (sq1, sq2,
//     dot, far) in Acc for each, summed as if it were the block's only slice. far = 0, but for
//     a slice whose sq1 or sq2 is not finite: that side is summed again scaled by
//     CekLimits::FAR (far bit 0: x1, bit 1: x2), as one block rescales a huge row (cek_huge.cuh,
//     "Huge rows").
//   the second launch, one per result: every block of row r adds the row's S partials in one
//     fixed tree over its 1024 threads (thread t holds partial t), so each of them holds the
//     same bits for c, r1 and r2. A row whose totals are not ordinary (a squared norm of 2^64
//     or more in float, 2^512 in double; a far partial; a NaN) adds the partials again, each
//     brought to the row's scales by a power of two (exact up to what flushes to zero), and
//     reads no element again for it.
//   _forward: block r writes out[r] (the forward kernel's loss).
//   _backward, _fused: block b reads its slice again, those loads issued with the partials'
//     (one load round), and writes that slice of dx1 and dx2 (the backward and fused kernels'
//     gradients, dy as theirs: T, dy_stride 0 or 1, scale; stored with the evict-first hint; a
//     rescaled row's slice is read a third time, element by element); the fused kernel's block
//     of slice 0 writes loss[r], loss_out[r] and y_out[r], each where given (the fused
//     kernel's). Blocks take the slices in reverse,
//     b = N*S - 1 - blockIdx.x: the first read again are those the sums read last, the ones
//     most likely still in L2.
//   _backward_keep: _backward for dx1, dx2 that hold the gradients for an upstream gradient of
//     1 (the backward-keep kernel's contract): a row whose dy is 1 is left as it is. Its grid
//     is capped (G blocks) and block b takes slices b, b + G, ... of the same reverse walk; with
//     dy_stride 0 (or no dy) at 1 every block returns after reading it.
//
// Launch contract: block [1024, 1, 1] (BLOCK_SIZE = 1024); grid [N, 1, 1] for _forward,
// [ceil(N*S / 2), 1, 1] for _sums, [N*S, 1, 1] for _backward and _fused, [G, 1, 1] with
// 1 <= G <= N*S for _backward_keep; N*S < 2^31; S <= 1024 (n_dim <= 1024*SLICE: 2^22 floats).
// sums: [N*S] CekSliceSums, written whole by _sums, read by the second launch.
//
// Bytes moved (S_T = sizeof(T), A = sizeof(Acc)): _sums reads x1 and x2 and writes 4 A a
// slice: 2*S_T*N*D + 4*A*N*S. _forward reads the partials and y, writes out: 4*A*N*S + 2*A*N.
// _backward and _fused read x1 and x2 again and write dx1 and dx2, read the partials and y,
// and write loss (fused) or read dy (backward): 4*S_T*N*D + 4*A*N*S + 2*A*N (the backward's dy
// S_T*N in place of A*N where it has one a row; the fused kernel's y_out A*N more). Each
// partial is read by the S blocks of its row (4*A*S bytes a block, from L2 but the first time)
// and counted once, as y[r] and dy[r] are. A pair moves the streamed kernels' 6*S_T*N*D
// (forward: 2*S_T*N*D) and 8*A*N*S (4*A*N*S) more. These count ordinary rows: a far slice is
// read once more by _sums, a rescaled row's slices once more by the gradient kernels.
#include "cek_row.cuh"

template <typename T>
struct CekSplit {
    static constexpr int THREADS = 1024;
    // Chunk pairs a thread holds from the loads to the gradient store. One: the gradient kernels
    // fit the 32 registers that two blocks of 1024 an SM allow (double: 40 to 48, one block),
    // where two pairs took 40 to 48 unbounded and spilled at 32.
    static constexpr int CHUNKS = 1;
    static constexpr int SLICE = THREADS * CHUNKS * CekVec<T>::N;
    // Slices a block of the sums launch reads, all loads in flight together: 64 bytes a thread,
    // 128 KB an SM at two blocks, where one slice a block kept 64 KB in flight (about 1.5 times
    // what Little's law asks of an H200 at its loaded latency: too little margin for a launch
    // that streams every byte of x1 and x2 once). Each slice is summed as alone: the same bits.
    static constexpr int SUMS_SLICES = 2;
};

// A slice's partial sums; far says which sides were summed scaled by CekLimits::FAR.
template <typename Acc>
struct alignas(16) CekSliceSums {
    Acc sq1, sq2, dot, far;
};

template <typename T>
__device__ __forceinline__ int cek_slices(int n_dim) {
    return (n_dim + CekSplit<T>::SLICE - 1) / CekSplit<T>::SLICE;  // n_dim <= 2^23
}

// Block b's row, slice, and where the slice starts and how long it is.
template <typename T>
struct CekSliceOf {
    int row, slice, n;
    long long first;  // offset of its first element in x1
};

template <typename T>
__device__ __forceinline__ CekSliceOf<T> cek_slice_of(int block, int slices, int n_dim) {
    CekSliceOf<T> s;
    s.row = block / slices;
    s.slice = block - s.row * slices;
    const int start = s.slice * CekSplit<T>::SLICE;
    s.n = n_dim - start < CekSplit<T>::SLICE ? n_dim - start : CekSplit<T>::SLICE;
    s.first = static_cast<long long>(s.row) * n_dim + start;
    return s;
}

template <typename Acc>
__device__ __forceinline__ bool cek_sums_finite(const CekSums<Acc>& s) {
    return s.sq1 <= CekLimits<Acc>::MAX && s.sq2 <= CekLimits<Acc>::MAX;
}

// A slice's partial sums from this thread's chunk pair p of it, written to sums[slice] by
// thread 0: the block's fixed tree, then for a slice whose squares overflow, the slice summed
// again with that side scaled (read again element by element). Every thread calls it; the
// caller passes a barrier between two calls (the tree's shared partials).
template <typename T>
__device__ __forceinline__ void cek_split_slice_sums(const CekChunk<T>& a, const CekChunk<T>& b,
                                                     const T* __restrict__ x1,
                                                     const T* __restrict__ x2,
                                                     const CekSliceOf<T>& at, int slice,
                                                     CekSliceSums<CekAcc<T>>* __restrict__ sums) {
    using Acc = CekAcc<T>;
    CekSums<Acc> s = {0, 0, 0};
    cek_accumulate(s, a, b);
    s = cek_block_sum(s);
    Acc far = 0;
    if (!cek_sums_finite(s)) {
        CEK_RARE_PATH();  // a slice whose squares overflow (or hold a NaN or an inf)
        const Acc s1 = s.sq1 <= CekLimits<Acc>::MAX ? Acc(1) : CekLimits<Acc>::FAR;
        const Acc s2 = s.sq2 <= CekLimits<Acc>::MAX ? Acc(1) : CekLimits<Acc>::FAR;
        far = Acc((s1 != Acc(1) ? 1 : 0) + (s2 != Acc(1) ? 2 : 0));
        __syncthreads();  // every warp has read the first sums' partials
        s = cek_block_sum(cek_element_sums(x1 + at.first, x2 + at.first, at.n, s1, s2));
    }
    if (threadIdx.x == 0) sums[slice] = {s.sq1, s.sq2, s.dot, far};
}

// This thread's chunk pair of each of a block's slices, all loads issued before any is used;
// the alignment test made once for all of them, as in cek_load_pairs.
template <int N, typename T>
__device__ __forceinline__ void cek_load_slices(CekChunk<T> (&a)[N], CekChunk<T> (&b)[N],
                                                const T* __restrict__ x1,
                                                const T* __restrict__ x2,
                                                const CekSliceOf<T> (&at)[N],
                                                const int (&width)[N], bool vec) {
    if (vec) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            a[i] = cek_load_chunk(x1 + at[i].first, threadIdx.x, width[i], true);
            b[i] = cek_load_chunk(x2 + at[i].first, threadIdx.x, width[i], true);
        }
        return;
    }
    CEK_RARE_PATH();  // a misaligned view
#pragma unroll
    for (int i = 0; i < N; ++i) {
        a[i] = cek_load_chunk(x1 + at[i].first, threadIdx.x, width[i], false);
        b[i] = cek_load_chunk(x2 + at[i].first, threadIdx.x, width[i], false);
    }
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_split_sums(const T* __restrict__ x1,
                                                 const T* __restrict__ x2,
                                                 CekSliceSums<CekAcc<T>>* __restrict__ sums,
                                                 int n_rows, int n_dim) {
    static_assert(BLOCK_SIZE == CekSplit<T>::THREADS, "blocks of 1024 threads");
    constexpr int PER_BLOCK = CekSplit<T>::SUMS_SLICES;
    const int slices = cek_slices<T>(n_dim);
    const int total = n_rows * slices;  // below 2^31
    const int first = static_cast<int>(blockIdx.x) * PER_BLOCK;
    if (first >= total) return;  // uniform
    const bool vec = cek_vectorizable<T>(n_dim, x1, x2, x1, x2);
    CekSliceOf<T> at[PER_BLOCK];
    int width[PER_BLOCK];
#pragma unroll
    for (int i = 0; i < PER_BLOCK; ++i) {  // a slice past the last (an odd total) reads nothing
        at[i] = cek_slice_of<T>(first + i < total ? first + i : first, slices, n_dim);
        width[i] = first + i < total ? at[i].n : 0;
    }
    // Every slice's loads go out before the first is summed: one load round for all of them.
    CekChunk<T> a[PER_BLOCK], b[PER_BLOCK];
    cek_load_slices(a, b, x1, x2, at, width, vec);
#pragma unroll
    for (int i = 0; i < PER_BLOCK; ++i) {
        if (first + i >= total) break;  // uniform
        if (i > 0) __syncthreads();  // every warp has read the previous slice's partials
        cek_split_slice_sums(a[i], b[i], x1, x2, at[i], first + i, sums);
    }
}

// Thread t's partial of the row (t < slices), else zeros, which add nothing.
template <typename Acc>
__device__ __forceinline__ CekSliceSums<Acc> cek_load_partial(
    const CekSliceSums<Acc>* __restrict__ row_sums, int slices) {
    const CekSliceSums<Acc> zero = {0, 0, 0, 0};
    return static_cast<int>(threadIdx.x) < slices ? row_sums[threadIdx.x] : zero;
}

// The row's cosine from its partials, p being this thread's (cek_load_partial), handed to
// finish(k, CekFlag<HUGE>{}) and its result returned: the same bits in every block of the row.
// A far side adds inf to the first totals, so that the row takes the rescaled branch with that
// side's scale FAR, as an overflowing row does in one block; there each partial is read again
// and brought to the row's scales (a far side is at FAR already) and the partials are added
// again. finish is inlined twice, as in cek_block_row: the ordinary path keeps nothing live
// for the huge one but the pointers it reads.
template <typename Acc, typename Finish>
__device__ __forceinline__ auto cek_split_row(CekSliceSums<Acc> p,
                                              const CekSliceSums<Acc>* __restrict__ row_sums,
                                              int slices, Finish finish) {
    using L = CekLimits<Acc>;
    const int far = static_cast<int>(p.far);
    // +inf from its bits: L::MAX * 2, the same value, is a front-end warning (#222-D).
    const Acc inf = sizeof(Acc) == 8 ? Acc(__longlong_as_double(0x7ff0000000000000ll))
                                     : Acc(__int_as_float(0x7f800000));
    const CekSums<Acc> s = cek_block_sum(
        CekSums<Acc>{far & 1 ? inf : p.sq1, far & 2 ? inf : p.sq2, p.dot});
    if (cek_sums_ordinary(s)) return finish(cek_cosine(s), CekFlag<false>{});
    CEK_RARE_PATH();  // a huge row, a far slice, or a NaN
    const Acc s1 = cek_scale_for(s.sq1), s2 = cek_scale_for(s.sq2);
    const CekSliceSums<Acc> q = cek_load_partial(row_sums, slices);
    const int f = static_cast<int>(q.far);
    // Left to right: q.sq1 * FAR * FAR keeps 2^-160, which FAR * FAR alone flushes to 0.
    const Acc t1 = f & 1 ? Acc(1) : s1, t2 = f & 2 ? Acc(1) : s2;
    __syncthreads();  // every warp has read the first sums' partials
    const CekSums<Acc> scaled = cek_block_sum(
        CekSums<Acc>{q.sq1 * t1 * t1, q.sq2 * t2 * t2, q.dot * t1 * t2});
    return finish(cek_scaled_cosine(scaled, s1, s2), CekFlag<true>{});
}

// A chunk pair's gradients, dx1's chunk formed and stored before dx2's: a 16-bit chunk is 8
// elements, and 32 floats live at once (cek_store_chunk_gradients forms both first) made the
// fused kernel spill at the 32 registers two blocks of 1024 an SM allow. Stored with the
// evict-first hint (cek_store_chunk<true>): dx is not read again here, and the slices of x1
// and x2 that the reverse walk has still to read should stay in L2 instead.
template <typename T>
__device__ __forceinline__ void cek_split_store_gradients(T* __restrict__ dx1,
                                                          T* __restrict__ dx2, int chunk,
                                                          int n_dim, bool vec,
                                                          const CekGradient<CekAcc<T>>& g,
                                                          const CekChunk<T>& a,
                                                          const CekChunk<T>& b) {
    constexpr int VEC = CekVec<T>::N;
    CekAcc<T> xs[VEC], zs[VEC], d[VEC];
    cek_chunk_to_acc(a, xs);
    cek_chunk_to_acc(b, zs);
#pragma unroll
    for (int i = 0; i < VEC; ++i) d[i] = g.p * zs[i] - g.q1 * xs[i];
    cek_store_chunk<true>(dx1, chunk, n_dim, vec, cek_chunk_from_acc<T>(d));
#pragma unroll
    for (int i = 0; i < VEC; ++i) d[i] = g.p * xs[i] - g.q2 * zs[i];
    cek_store_chunk<true>(dx2, chunk, n_dim, vec, cek_chunk_from_acc<T>(d));
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_split_forward(
    const CekAcc<T>* __restrict__ y, const CekSliceSums<CekAcc<T>>* __restrict__ sums,
    CekAcc<T>* __restrict__ out, int n_rows, int n_dim, CekAcc<T> margin) {
    static_assert(BLOCK_SIZE == CekSplit<T>::THREADS, "blocks of 1024 threads");
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // uniform
    const int slices = cek_slices<T>(n_dim);
    const CekSliceSums<CekAcc<T>>* row_sums = sums + static_cast<long long>(row) * slices;
    const CekAcc<T> label = y[row];  // in flight with the partials
    const CekAcc<T> row_loss = cek_split_row(
        cek_load_partial(row_sums, slices), row_sums, slices,
        [&](const CekCosine<CekAcc<T>>& k, auto) { return cek_row_loss(k.c, label, margin); });
    if (threadIdx.x == 0) out[row] = row_loss;
}

// One slice's gradient launch, block b of the N*S (b = N*S - 1 - blockIdx.x, or the same walk
// over a capped grid for the keep kernel). loss: the fused kernel's per-row loss, or nullptr
// (backward); y_out: the fused kernel's copy of the labels, or nullptr. Row r's upstream
// gradient is scale * dy[r * dy_stride], or scale without dy.
template <typename T>
__device__ __forceinline__ void cek_split_slice_gradients(
    int block, const T* __restrict__ dy, int dy_stride, CekAcc<T> scale,
    const T* __restrict__ x1, const T* __restrict__ x2, const CekAcc<T>* __restrict__ y,
    const CekSliceSums<CekAcc<T>>* __restrict__ sums, CekAcc<T>* __restrict__ loss,
    T* __restrict__ dx1, T* __restrict__ dx2, T* __restrict__ loss_out,
    CekAcc<T>* __restrict__ y_out, int slices, int n_dim, CekAcc<T> margin) {
    using Acc = CekAcc<T>;
    const CekSliceOf<T> at = cek_slice_of<T>(block, slices, n_dim);
    const bool vec = cek_vectorizable_flat<T>(n_dim, x1, x2, dx1, dx2);
    const Acc label = y[at.row];
    const T g = cek_upstream_or_one(dy, dy_stride, at.row);
    const CekSliceSums<Acc>* row_sums = sums + static_cast<long long>(at.row) * slices;
    // The slice's loads and the partials' in flight together: one load round.
    CekRowPair<CekSplit<T>::CHUNKS, T> rp;
    cek_load_pairs(rp.a, rp.b, x1 + at.first, x2 + at.first, threadIdx.x, blockDim.x, at.n,
                   vec);
    cek_split_row(
        cek_load_partial(row_sums, slices), row_sums, slices,
        [&](const CekCosine<Acc>& k, auto huge) {
            if (at.slice == 0 && threadIdx.x == 0) {
                cek_store_row_loss(loss, loss_out, at.row, cek_row_loss(k.c, label, margin));
                if (y_out != nullptr) y_out[at.row] = label;
            }
            const CekGradient<Acc> grad = cek_gradient(
                k, cek_row_coeff(k.c, label, margin, scale * CekType<T>::to_acc(g)));
            if constexpr (decltype(huge)::value) {  // the slice read again, rescaled
                cek_element_gradients(x1 + at.first, x2 + at.first, dx1 + at.first,
                                      dx2 + at.first, at.n, grad);
            } else {
#pragma unroll
                for (int i = 0; i < CekSplit<T>::CHUNKS; ++i)
                    cek_split_store_gradients(dx1 + at.first, dx2 + at.first,
                                              threadIdx.x + i * blockDim.x, at.n, vec, grad,
                                              rp.a[i], rp.b[i]);
            }
        });
}

// A block a slice, in reverse: the first read again are those the sums read last, the ones
// most likely still in L2.
template <typename T>
__device__ __forceinline__ void cek_split_gradients(
    const T* __restrict__ dy, int dy_stride, CekAcc<T> scale, const T* __restrict__ x1,
    const T* __restrict__ x2, const CekAcc<T>* __restrict__ y,
    const CekSliceSums<CekAcc<T>>* __restrict__ sums, CekAcc<T>* __restrict__ loss,
    T* __restrict__ dx1, T* __restrict__ dx2, T* __restrict__ loss_out,
    CekAcc<T>* __restrict__ y_out, int n_rows, int n_dim, CekAcc<T> margin) {
    const int slices = cek_slices<T>(n_dim);
    const int block = n_rows * slices - 1 - static_cast<int>(blockIdx.x);  // below 2^31
    if (block < 0) return;  // uniform
    cek_split_slice_gradients(block, dy, dy_stride, scale, x1, x2, y, sums, loss, dx1, dx2,
                              loss_out, y_out, slices, n_dim, margin);
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_split_backward(
    const T* __restrict__ dy, int dy_stride, CekAcc<T> scale, const T* __restrict__ x1,
    const T* __restrict__ x2, const CekAcc<T>* __restrict__ y,
    const CekSliceSums<CekAcc<T>>* __restrict__ sums, T* __restrict__ dx1, T* __restrict__ dx2,
    int n_rows, int n_dim, CekAcc<T> margin) {
    static_assert(BLOCK_SIZE == CekSplit<T>::THREADS, "blocks of 1024 threads");
    cek_split_gradients<T>(dy, dy_stride, scale, x1, x2, y, sums, nullptr, dx1, dx2, nullptr,
                           nullptr, n_rows, n_dim, margin);
}

// The keep kernel's grid is at most a wave (grid [G, 1, 1], G <= N*S): block b takes the
// slices b, b + G, ... of the reverse walk. A row whose dy is 1 keeps the fused kernel's
// gradients; with dy_stride 0 (or no dy) at 1 every block returns after one load.
template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_split_backward_keep(
    const T* __restrict__ dy, int dy_stride, CekAcc<T> scale, const T* __restrict__ x1,
    const T* __restrict__ x2, const CekAcc<T>* __restrict__ y,
    const CekSliceSums<CekAcc<T>>* __restrict__ sums, T* __restrict__ dx1, T* __restrict__ dx2,
    int n_rows, int n_dim, CekAcc<T> margin) {
    static_assert(BLOCK_SIZE == CekSplit<T>::THREADS, "blocks of 1024 threads");
    using Acc = CekAcc<T>;
    const auto kept = [&](int row) {  // a NaN dy is recomputed (its gradient is NaN)
        return CekType<T>::to_acc(cek_upstream(dy, dy_stride, row)) == Acc(1);
    };
    const int slices = cek_slices<T>(n_dim);
    // One counter (the slice), uniform over the block: what the loop keeps live through the
    // slice's work beside it spilled the 16-bit kernels (32 registers: two blocks an SM).
    for (int block = n_rows * slices - 1 - static_cast<int>(blockIdx.x); block >= 0;
         block -= gridDim.x) {
        if (kept(block / slices)) {
            if (dy_stride == 0) return;  // one gradient for every row, the fused kernel's
            continue;
        }
        cek_split_slice_gradients<T>(block, dy, dy_stride, scale, x1, x2, y, sums, nullptr, dx1,
                                     dx2, nullptr, nullptr, slices, n_dim, margin);
        __syncthreads();  // the row's shared partial sums are written again next slice
    }
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_split_fused(
    const T* __restrict__ x1, const T* __restrict__ x2, const CekAcc<T>* __restrict__ y,
    const T* __restrict__ dy, int dy_stride, CekAcc<T> scale,
    const CekSliceSums<CekAcc<T>>* __restrict__ sums, CekAcc<T>* __restrict__ loss,
    T* __restrict__ dx1, T* __restrict__ dx2, T* __restrict__ loss_out,
    CekAcc<T>* __restrict__ y_out, int n_rows, int n_dim, CekAcc<T> margin) {
    static_assert(BLOCK_SIZE == CekSplit<T>::THREADS, "blocks of 1024 threads");
    cek_split_gradients<T>(dy, dy_stride, scale, x1, x2, y, sums, loss, dx1, dx2, loss_out, y_out,
                           n_rows, n_dim, margin);
}
