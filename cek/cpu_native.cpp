// The NumPy path's rows (cek/cpu.py), compiled: one pass over a row for its three sums, then
// its gradients while the row is still in cache, where NumPy needs about a dozen passes.
//
// Every operation is the one cek/cpu.py performs, in the same order and precision (built with
// -ffp-contract=off, so no multiply-add is fused), and the sums are NumPy's pairwise summation:
// the results are bitwise those of the NumPy code, which stays the fallback and the yardstick
// (tests/test_cpu_native.py). Rows whose squared norm would overflow are left to cek/cpu.py,
// which finds them from the sums written to sq1 and sq2.

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

// float16 <-> float32 a row at a time. g++ converts _Float16 one element at a time; F16C
// converts 8 (rounding to nearest even, overflow to inf, as NumPy's cast and the scalar path).
void widen(const _Float16* in, float* out, int64_t n) {
    int64_t j = 0;
#if defined(__F16C__)
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(out + j, _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + j))));
#endif
    for (; j < n; ++j) out[j] = float(in[j]);
}

void narrow(const float* in, _Float16* out, int64_t n) {
    int64_t j = 0;
#if defined(__F16C__)
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + j), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; j < n; ++j) out[j] = _Float16(in[j]);
}

// numpy/_core/src/umath/loops_utils.h.src, pairwise_sum, over the products a[i]*b[i] each
// rounded to A (what np.add.reduce(a * b, axis=1) sums). Blocks of up to 128 use 8 partial
// sums; longer runs split in two at a multiple of 8.
template <class A>
A pairwise_dot(const A* a, const A* b, int64_t n) {
    if (n < 8) {
        A sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
        return sum;
    }
    if (n <= 128) {
        A r[8];
        for (int j = 0; j < 8; ++j) r[j] = a[j] * b[j];
        int64_t i = 8;
        for (; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; ++j) r[j] += a[i + j] * b[i + j];
        A sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) sum += a[i] * b[i];
        return sum;
    }
    int64_t half = n / 2;
    half -= half % 8;
    return pairwise_dot<A>(a, b, half) + pairwise_dot<A>(a + half, b + half, n - half);
}

// Rows [0, n) of x1, x2 (S elements, accumulated in A). label: 1, -1 or 0 (any other label).
// g: the upstream gradient of row i at g[i * g_stride]. loss, dx1/dx2: null when not wanted.
template <class A, class S>
void rows(const S* x1, const S* x2, int64_t n, int64_t d, const int8_t* label, A margin, A eps,
          const A* g, int64_t g_stride, A* loss, S* dx1, S* dx2, A* sq1_out, A* sq2_out) {
    // A float16 row is widened once into float buffers, and its gradients are rounded from
    // float buffers, rather than converting element by element inside every loop.
    constexpr bool half = !std::is_same_v<A, S>;
    std::vector<A> wide1(half ? d : 0), wide2(half ? d : 0), grad1(half ? d : 0),
        grad2(half ? d : 0);
    for (int64_t i = 0; i < n; ++i) {
        const A* a;
        const A* b;
        if constexpr (half) {
            widen(x1 + i * d, wide1.data(), d);
            widen(x2 + i * d, wide2.data(), d);
            a = wide1.data();
            b = wide2.data();
        } else {
            a = x1 + i * d;
            b = x2 + i * d;
        }
        A sq1 = pairwise_dot<A>(a, a, d), sq2 = pairwise_dot<A>(b, b, d);
        A dot = pairwise_dot<A>(a, b, d);
        sq1_out[i] = sq1;
        sq2_out[i] = sq2;
        A r1 = A(1) / std::sqrt(sq1 + eps), r2 = A(1) / std::sqrt(sq2 + eps);
        A c = dot * r1 * r2;
        // cek.cpu.row_loss and row_coeff: `c <= margin` keeps a NaN c NaN for label -1.
        if (loss) loss[i] = label[i] == 1 ? A(1) - c
                          : label[i] == -1 ? (c <= margin ? A(0) : c - margin) : A(0);
        if (!dx1) continue;
        A gi = g[i * g_stride];
        A coeff = label[i] == 1 ? -gi : (label[i] == -1 && c > margin) ? gi : A(0);
        A p = coeff * r1 * r2, q1 = coeff * c * r1 * r1, q2 = coeff * c * r2 * r2;
        A* out1;
        A* out2;
        if constexpr (half) {
            out1 = grad1.data();
            out2 = grad2.data();
        } else {
            out1 = dx1 + i * d;
            out2 = dx2 + i * d;
        }
        for (int64_t j = 0; j < d; ++j) {
            out1[j] = b[j] * p - a[j] * q1;
            out2[j] = a[j] * p - b[j] * q2;
        }
        if constexpr (half) {
            narrow(out1, dx1 + i * d, d);
            narrow(out2, dx2 + i * d, d);
        }
    }
}

}  // namespace

#define CEK_ROWS(NAME, A, S)                                                                  \
    extern "C" __attribute__((visibility("default"))) void NAME(                              \
        const S* x1, const S* x2, int64_t n, int64_t d, const int8_t* label, A margin, A eps, \
        const A* g, int64_t g_stride, A* loss, S* dx1, S* dx2, A* sq1, A* sq2) {              \
        rows<A, S>(x1, x2, n, d, label, margin, eps, g, g_stride, loss, dx1, dx2, sq1, sq2);  \
    }

// float16 rounds float32 results to nearest even, overflow to inf: NumPy's cast.
CEK_ROWS(cek_cpu_rows_float16, float, _Float16)
CEK_ROWS(cek_cpu_rows_float32, float, float)
CEK_ROWS(cek_cpu_rows_float64, double, double)
