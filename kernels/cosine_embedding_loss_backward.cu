// cosine_embedding_loss_backward: gradient of the per-row cosine embedding loss.
//
// Arguments: (dy, x1, x2, y, dx1, dx2, n_rows, n_dim, margin), the documented contract, fixed.
// Math, per row r of x1, x2 [n_rows, n_dim] (C-contiguous, T = float, double, cek_f16 or cek_bf16;
// sums and gradients in Acc = double for double, float otherwise; y, margin are Acc):
//   sq1 = sum x1^2,  sq2 = sum x2^2,  dot = sum x1*x2
//   r1 = 1/sqrt(sq1 + EPS),  r2 = 1/sqrt(sq2 + EPS),  EPS = 1e-12,  c = dot*r1*r2
//   dc/dx1[k] = (x2[k]*r2 - c*x1[k]*r1)*r1,   dc/dx2[k] = (x1[k]*r1 - c*x2[k]*r2)*r2
//   g = dy[r]                                  the upstream gradient, of type T, one a row
//   coeff = -g if y[r] == 1;  g if y[r] == -1 and c > margin;  0 otherwise
//   dx1 = coeff*dc/dx1,  dx2 = coeff*dc/dx2   (every element written, zeros included)
// (cek_store_row_gradients expands these to save multiplies.)
//
// Launch contract: grid [n_rows, 1, 1], one block per row. BLOCK_SIZE = next_power_of_two(n_dim),
// at most 2^20. blockDim.x = 32 * ceil(n_dim / (32 * E)), E = CekTiling's CHUNKS * VEC, the
// elements a thread holds, by dtype and BLOCK_SIZE (as `cek list` prints it):
//   f32: 4 (1..512), 8 (1024..8192), 16 (16384); f64: 2 (1..2048), 4 (4096), 8 (8192);
//   f16, bf16: 8 (1..1024), 16 (2048..16384)
// (two 16-byte chunks a thread from 256 chunks, 513 floats and 1025 16-bit values: cek_tiling.cuh),
// but 672 where that gives 704 or 736 in float at BLOCK_SIZE 8192 (CekTiling::TAILED: a thread
// then holds one element past its chunks); wider rows (above 16384 elements, 8192 doubles): 1024
// threads stream the row.
//
// Bytes moved (S = sizeof(T), A = sizeof(Acc)): read x1, x2 and write dx1, dx2 once, plus y and
// dy: 4*S*N*D + A*N + S*N (16*N*D + 8*N in float; the variants' dy_stride 0: S for dy). A
// streamed row is read twice: 6*S*N*D. These count ordinary rows: a row with a squared norm of
// 2^64 or more in float (2^512 in double) is summed again rescaled and read again (cek_huge.cuh,
// "Huge rows").
//
// cosine_embedding_loss_backward_rows: cek's own backward, with the upstream gradient in place:
// arguments (dy, dy_stride, scale, x1, x2, y, dx1, dx2, n_rows, n_dim, margin) and
//   g = scale * dy[r * dy_stride]   dy_stride 1: one a row; 0: one for every row (a mean's or a
//                                   sum's 0-d gradient, read in place; scale = 1/n_rows, or 1)
// (scale Acc), and the fused kernel's launch contract: rows of up to 64 chunks and 256 elements
// (float: n_dim <= 256), and 16-bit rows of 513..1024, in row groups, 256 threads a block,
// GROUP (CekTiling::GROUP) lanes per row, grid [ceil(n_rows / (256 / GROUP)), 1, 1]; wider rows
// exactly as above. The faster variant for narrow rows: one block per row gives a 128-float row
// a one-warp block (cek_tiling.cuh).
//
// cosine_embedding_loss_backward_keep: the _rows variant's arguments and results, for dx1 and dx2
// that already hold the gradients for an upstream gradient of 1 (cek.torch's training step runs
// the fused kernel in the forward): a row whose dy is 1 is left as it is, every other row is
// recomputed. Blocks of the _rows variant's threads, but a grid of at most one wave: grid
// [G, 1, 1], 1 <= G <= the _rows variant's grid (U blocks: a block a row, or a row group);
// block b takes the units [b*U/G, (b+1)*U/G), which at G = U are backward-rows's block b's.
// With dy_stride 0 (or no dy) every block reads dy once and, where it is 1 (a mean's or a sum's
// loss.backward()), returns: the step's backward costs a wave of blocks that read one value,
// whatever N. Otherwise a block takes its rows one after another (one block per row) or a row
// a group, reading each row's dy first; a row it recomputes costs what the _rows kernel's row
// does, and one more memory round trip (dy, then y and the row), a kept row its dy alone.
#include "cek_row.cuh"

// One row per block. g: the row's upstream gradient before the scale, as loaded (T, widened
// after the sums: cek_upstream) or as the keep kernel holds it (Acc), loaded with y before the
// row so that all its loads are in flight together: one load round.
template <int BLOCK_SIZE, typename T, typename Upstream>
__device__ __forceinline__ void cek_backward_row(int row, Upstream upstream, CekAcc<T> scale,
                                                 const T* __restrict__ x1,
                                                 const T* __restrict__ x2,
                                                 const CekAcc<T>* __restrict__ y,
                                                 T* __restrict__ dx1, T* __restrict__ dx2,
                                                 int n_dim, CekAcc<T> margin) {
    // 64-bit offset: n_rows * n_dim may exceed 2^31.
    const long long offset = static_cast<long long>(row) * n_dim;
    const bool vec = cek_vectorizable<T>(n_dim, x1, x2, dx1, dx2);
    const CekAcc<T> label = y[row];
    const auto g = upstream();
    CekRowPair<CekTiling<BLOCK_SIZE, T>::CHUNKS, T> rp;
    cek_block_row<BLOCK_SIZE, T>(
        rp, x1 + offset, x2 + offset, n_dim, vec,
        [&](const CekCosine<CekAcc<T>>& k, auto huge) {
            const CekAcc<T> coeff =
                cek_row_coeff(k.c, label, margin, scale * cek_widen(g));
            cek_block_row_gradients<decltype(huge)::value, BLOCK_SIZE, T>(
                rp, x1 + offset, x2 + offset, dx1 + offset, dx2 + offset, n_dim, vec,
                cek_gradient(k, coeff));
        });
}

// One row group of lanes: `row` if live (the lanes of a group that is not live take part in
// the shuffles with zeros, load nothing and store nothing); g as in cek_backward_row.
template <int BLOCK_SIZE, typename T, typename G>
__device__ __forceinline__ void cek_backward_group_row(int row, bool live, G g, CekAcc<T> scale,
                                                       const T* __restrict__ x1,
                                                       const T* __restrict__ x2,
                                                       const CekAcc<T>* __restrict__ y,
                                                       T* __restrict__ dx1, T* __restrict__ dx2,
                                                       int n_dim, CekAcc<T> margin) {
    const bool vec = cek_vectorizable<T>(n_dim, x1, x2, dx1, dx2);
    auto r = cek_group_row_at<BLOCK_SIZE, T>(row, live, n_dim);
    const CekAcc<T> label = r.live ? y[r.row] : 0;
    cek_group_row_cosine(r, x1, x2, n_dim, vec);
    if (!r.live) return;  // after the last shuffle
    const CekAcc<T> coeff = cek_row_coeff(r.k.c, label, margin, scale * cek_widen(g));
    cek_store_row_gradients(r.rp, x1 + r.offset, x2 + r.offset, dx1 + r.offset, dx2 + r.offset,
                            n_dim, vec, r.lane, CekTiling<BLOCK_SIZE, T>::GROUP,
                            cek_gradient(r.k, coeff));
}

// One block per row, the upstream gradient scale * dy[row * dy_stride]: the seed's kernel
// (dy_stride 1, scale 1) and the _rows variant's rows too wide for row groups.
template <int BLOCK_SIZE, typename T>
__device__ __forceinline__ void cek_backward_block(const T* __restrict__ dy, int dy_stride,
                                                   CekAcc<T> scale, const T* __restrict__ x1,
                                                   const T* __restrict__ x2,
                                                   const CekAcc<T>* __restrict__ y,
                                                   T* __restrict__ dx1, T* __restrict__ dx2,
                                                   int n_rows, int n_dim, CekAcc<T> margin) {
    const int row = blockIdx.x;
    if (row >= n_rows) return;  // uniform over the block: no barrier is skipped by part of it
    cek_backward_row<BLOCK_SIZE, T>(
        row, [&] { return cek_upstream(dy, dy_stride, row); }, scale, x1, x2, y, dx1, dx2, n_dim,
        margin);
}

// The documented launch contract: dy one value a row (T), grid [n_rows, 1, 1].
template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_backward(const T* __restrict__ dy,
                                               const T* __restrict__ x1,
                                               const T* __restrict__ x2,
                                               const CekAcc<T>* __restrict__ y,
                                               T* __restrict__ dx1, T* __restrict__ dx2,
                                               int n_rows, int n_dim, CekAcc<T> margin) {
    cek_backward_block<BLOCK_SIZE, T>(dy, 1, CekAcc<T>(1), x1, x2, y, dx1, dx2, n_rows, n_dim,
                                      margin);
}

template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_backward_rows(const T* __restrict__ dy, int dy_stride,
                                                    CekAcc<T> scale, const T* __restrict__ x1,
                                                    const T* __restrict__ x2,
                                                    const CekAcc<T>* __restrict__ y,
                                                    T* __restrict__ dx1, T* __restrict__ dx2,
                                                    int n_rows, int n_dim, CekAcc<T> margin) {
    using Tiling = CekTiling<BLOCK_SIZE, T>;
    if constexpr (Tiling::GROUPED) {
        // Below 2^31: the grid's rows, ceil(n_rows / R) * R for R a power of two, are at most
        // 2^31 for n_rows < 2^31.
        const int row = blockIdx.x * (blockDim.x / Tiling::GROUP) + threadIdx.x / Tiling::GROUP;
        const bool live = row < n_rows;
        const T g = live ? cek_upstream(dy, dy_stride, row) : T{};
        cek_backward_group_row<BLOCK_SIZE, T>(row, live, g, scale, x1, x2, y, dx1, dx2, n_dim,
                                              margin);
    } else {
        cek_backward_block<BLOCK_SIZE, T>(dy, dy_stride, scale, x1, x2, y, dx1, dx2, n_rows,
                                          n_dim, margin);
    }
}

// The keep kernel's upstream gradient of `row`, widened: 1 (kept) past `last`. Unsigned: a
// row group's rows past the last may pass 2^31 - 1 (n_rows within a trip of 2^31), which an int
// would overflow; they stay far below 2^32.
template <typename T>
__device__ __forceinline__ CekAcc<T> cek_keep_upstream(const T* __restrict__ dy, int dy_stride,
                                                       unsigned row, unsigned last) {
    return row < last ? cek_widen(cek_upstream(dy, dy_stride, static_cast<int>(row)))
                      : CekAcc<T>(1);
}

// The loop's own state is a few values (and a row group's one held dy) beside a row's work,
// which the twin kernels fit at 32 registers with none to spare: the keep kernel is held to
// 3/4 of an SM's threads (cek/cosine_embedding_loss_backward.py, min_blocks), where at 32 it
// spilled on sm_80 (float row groups, tailed float and bfloat16 rows) and on sm_90 in other
// arrangements of the same loop (a list of the rows to recompute in shared memory, a trip of
// dy held through a row's work, rows strided across the grid).
template <int BLOCK_SIZE, typename T = float>
__device__ void cosine_embedding_loss_backward_keep(const T* __restrict__ dy, int dy_stride,
                                                    CekAcc<T> scale, const T* __restrict__ x1,
                                                    const T* __restrict__ x2,
                                                    const CekAcc<T>* __restrict__ y,
                                                    T* __restrict__ dx1, T* __restrict__ dx2,
                                                    int n_rows, int n_dim, CekAcc<T> margin) {
    using Tiling = CekTiling<BLOCK_SIZE, T>;
    using Acc = CekAcc<T>;
    // Block b takes an even share of the units (a row, or a row group's GROUPS rows): with a
    // block a unit (the widest grid), the rows backward-rows's block b takes.
    constexpr int UNIT = Tiling::GROUPED ? Tiling::GROUPED_THREADS / Tiling::GROUP : 1;
    const long long units = (n_rows + (UNIT - 1LL)) / UNIT;  // n_rows + UNIT - 1 may pass 2^31
    const int first = static_cast<int>(blockIdx.x * units / gridDim.x * UNIT);
    const long long end = (blockIdx.x + 1LL) * units / gridDim.x * UNIT;
    const int last = end < n_rows ? static_cast<int>(end) : n_rows;
    if constexpr (Tiling::GROUPED) {
        // One gradient for every row (a mean's or a sum's), the fused kernel's: nothing to do.
        // Read before the trips (a round of its own): tested inside them, as one block a row
        // does, the check cost a row-group thread a register (8 bytes spilled at 32 at D = 33).
        if (dy_stride == 0 && cek_keep_upstream(dy, 0, 0, 1) == Acc(1)) return;
        // Group g of the block takes rows first + g, first + g + GROUPS, ...: a trip of GROUP
        // of them, lane l holding the dy of the l-th (all of a trip's dy loads in flight
        // together, coalesced), read by the group with a shuffle. Trips and rows count in
        // unsigned: past `last` they pass 2^31 - 1 where n_rows is within a trip of 2^31 (an
        // int would overflow there), never 2^32. A row not live is not read (its int unused).
        constexpr int GROUP = Tiling::GROUP, GROUPS = Tiling::GROUPED_THREADS / GROUP;
        const unsigned group = threadIdx.x / GROUP, lane = threadIdx.x % GROUP;
        const unsigned end = static_cast<unsigned>(last);
        for (unsigned trip = first; trip < end; trip += GROUP * GROUPS) {  // uniform
            const Acc held = cek_keep_upstream(dy, dy_stride, trip + group + lane * GROUPS, end);
            for (int i = 0; i < GROUP; ++i) {  // every lane of the warp, for the shuffles
                const unsigned row = trip + group + i * GROUPS;
                const Acc g = __shfl_sync(0xffffffffu, held, i, GROUP);
                cek_backward_group_row<BLOCK_SIZE, T>(static_cast<int>(row),
                                                      row < end && !(g == Acc(1)), g, scale, x1,
                                                      x2, y, dx1, dx2, n_dim, margin);
            }
        }
    } else {
        // A row after another, its dy first: every thread loads the same value (a broadcast,
        // from L1 but for the first row of each 128-byte line), so the branch is uniform. The
        // loop's bound is read from shared memory, out of the registers a streamed row's work
        // fills: held in one, the float row of 65536 spilled at 64 on sm_120 (NVRTC 13.5).
        __shared__ int block_last;
        if (threadIdx.x == 0) block_last = last;
        __syncthreads();
        for (int row = first; row < block_last; ++row) {  // uniform
            const Acc g = cek_widen(cek_upstream(dy, dy_stride, row));
            if (g == Acc(1)) {  // kept
                if (dy_stride == 0) return;  // one gradient for every row, the fused kernel's
                continue;
            }
            cek_backward_row<BLOCK_SIZE, T>(
                row, [&] { return g; }, scale, x1, x2, y, dx1, dx2, n_dim, margin);
            __syncthreads();  // the block sums' shared partials are written again next row
        }
    }
}
