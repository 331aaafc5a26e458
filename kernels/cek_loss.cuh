// cek_loss.cuh: a row's loss, its gradient's coefficient and the gradient's stores.
#pragma once

#include "cek_sums.cuh"

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
