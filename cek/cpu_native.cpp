// The NumPy path's rows (cek/cpu.py), compiled: one pass over a row for its three sums, then
// its gradients while the row is still in cache, where NumPy needs about a dozen passes.
//
// Every operation is the one cek/cpu.py performs, in the same order and precision (built with
// -ffp-contract=off, so no multiply-add is fused), and the sums are NumPy's pairwise summation:
// the results are bitwise those of the NumPy code, which stays the fallback and the yardstick
// (tests/test_cpu_native.py). Rows whose squared norm would overflow are left to cek/cpu.py,
// which finds them from the sums written to sq1 and sq2.
//
// Storage types: float, double, _Float16, and bfloat16 as its uint16 bits (NumPy has no
// bfloat16). The two half types are widened to float a row at a time and their gradients
// rounded back from float.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>
#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace {

// float16 <-> float32. g++ converts _Float16 one element at a time; F16C converts 8 (rounding
// to nearest even, overflow to inf, as NumPy's cast and the scalar path).
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

// bfloat16 bits <-> float32: a bfloat16 is the top half of a float32. Rounding is cek.dtypes'
// from_float (nearest even; a NaN keeps its top bits and is made quiet, so it stays NaN), in
// integers: AVX512-BF16's conversion would flush subnormals to zero. Both loops vectorise.
void widen(const uint16_t* in, float* out, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        uint32_t bits = uint32_t(in[j]) << 16;
        std::memcpy(out + j, &bits, 4);
    }
}

void narrow(const float* in, uint16_t* out, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        uint32_t bits;
        std::memcpy(&bits, in + j, 4);
        uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
        bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
        out[j] = uint16_t(nan ? (bits >> 16) | 0x40u : rounded);
    }
}

// A row's three sums: sum a*a, sum b*b, sum a*b.
template <class A>
struct Sums {
    A sq1, sq2, dot;
};

// Eight lanes of A, the 8 partial sums of NumPy's pairwise blocks: g++ vector arithmetic is
// lane by lane, the same operations as a loop over r[0..7], which g++ does not vectorise when
// it holds three such loops at once.
template <class A>
struct Lanes {
    typedef A type __attribute__((vector_size(8 * sizeof(A))));
};

template <class A>
typename Lanes<A>::type load8(const A* p) {
    typename Lanes<A>::type v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// numpy/_core/src/umath/loops_utils.h.src, pairwise_sum, over the products each rounded to A
// (what np.add.reduce(a * b, axis=1) sums), for the three products of a row at once: each sum
// keeps NumPy's order, and the three independent chains keep the FPU busy where one would wait
// on its own additions. Blocks of up to 128 use 8 partial sums; longer runs split in two at a
// multiple of 8.
template <class A>
Sums<A> pairwise_sums(const A* a, const A* b, int64_t n) {
    if (n < 8) {
        A s1 = 0, s2 = 0, s12 = 0;
        for (int64_t i = 0; i < n; ++i) {
            s1 += a[i] * a[i];
            s2 += b[i] * b[i];
            s12 += a[i] * b[i];
        }
        return {s1, s2, s12};
    }
    if (n <= 128) {
        auto va = load8(a), vb = load8(b);
        auto r1 = va * va, r2 = vb * vb, r12 = va * vb;
        int64_t i = 8;
        for (; i < n - n % 8; i += 8) {
            va = load8(a + i);
            vb = load8(b + i);
            r1 += va * va;
            r2 += vb * vb;
            r12 += va * vb;
        }
        auto tree = [](const typename Lanes<A>::type& r) {
            return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        };
        Sums<A> s{tree(r1), tree(r2), tree(r12)};
        for (; i < n; ++i) {
            s.sq1 += a[i] * a[i];
            s.sq2 += b[i] * b[i];
            s.dot += a[i] * b[i];
        }
        return s;
    }
    int64_t half = n / 2;
    half -= half % 8;
    Sums<A> x = pairwise_sums<A>(a, b, half), y = pairwise_sums<A>(a + half, b + half, n - half);
    return {x.sq1 + y.sq1, x.sq2 + y.sq2, x.dot + y.dot};
}

// dx1 = p*b - q1*a, dx2 = p*a - q2*b over [0, n): cek/cpu.py's two products and difference.
template <class A>
void gradients(const A* a, const A* b, int64_t n, A p, A q1, A q2, A* out1, A* out2) {
    for (int64_t j = 0; j < n; ++j) {
        out1[j] = b[j] * p - a[j] * q1;
        out2[j] = a[j] * p - b[j] * q2;
    }
}

// Rows [0, n) of x1, x2 (S elements, accumulated in A). label: 1, -1 or 0 (any other label).
// g: the upstream gradient of row i at g[i * g_stride]. loss, dx1/dx2: null when not wanted.
template <class A, class S>
void rows(const S* x1, const S* x2, int64_t n, int64_t d, const int8_t* label, A margin, A eps,
          const A* g, int64_t g_stride, A* loss, S* dx1, S* dx2, A* sq1_out, A* sq2_out) {
    // A half-precision row is widened once into float buffers, rather than converted inside
    // every loop; its gradients go through a chunk that stays in L1 on the way back.
    constexpr bool half = !std::is_same_v<A, S>;
    constexpr int64_t chunk = 512;
    std::vector<A> wide1(half ? d : 0), wide2(half ? d : 0), grad1(half ? chunk : 0),
        grad2(half ? chunk : 0);
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
        Sums<A> s = pairwise_sums<A>(a, b, d);
        sq1_out[i] = s.sq1;
        sq2_out[i] = s.sq2;
        A r1 = A(1) / std::sqrt(s.sq1 + eps), r2 = A(1) / std::sqrt(s.sq2 + eps);
        A c = s.dot * r1 * r2;
        // cek.cpu.row_loss and row_coeff: `c <= margin` keeps a NaN c NaN for label -1.
        if (loss) loss[i] = label[i] == 1 ? A(1) - c
                          : label[i] == -1 ? (c <= margin ? A(0) : c - margin) : A(0);
        if (!dx1) continue;
        A gi = g[i * g_stride];
        A coeff = label[i] == 1 ? -gi : (label[i] == -1 && c > margin) ? gi : A(0);
        A p = coeff * r1 * r2, q1 = coeff * c * r1 * r1, q2 = coeff * c * r2 * r2;
        if constexpr (half) {
            for (int64_t j = 0; j < d; j += chunk) {
                int64_t m = d - j < chunk ? d - j : chunk;
                gradients<A>(a + j, b + j, m, p, q1, q2, grad1.data(), grad2.data());
                narrow(grad1.data(), dx1 + i * d + j, m);
                narrow(grad2.data(), dx2 + i * d + j, m);
            }
        } else {
            gradients<A>(a, b, d, p, q1, q2, dx1 + i * d, dx2 + i * d);
        }
    }
}

// rows() over n_threads runs of consecutive rows, run t on thread t (the caller runs the last).
// Rows are independent, so the split changes no bit. Threads are started per call, which costs
// tens of microseconds (a Python thread pool costs about 0.3 ms); a thread that cannot be
// started leaves its run to the caller.
template <class A, class S>
void rows_threaded(const S* x1, const S* x2, int64_t n, int64_t d, const int8_t* label,
                   A margin, A eps, const A* g, int64_t g_stride, A* loss, S* dx1, S* dx2,
                   A* sq1, A* sq2, int64_t n_threads) {
    auto run = [=](int64_t t) {
        int64_t first = n * t / n_threads, stop = n * (t + 1) / n_threads;
        auto at = [](auto* p, int64_t offset) { return p ? p + offset : p; };
        rows<A, S>(x1 + first * d, x2 + first * d, stop - first, d, label + first, margin, eps,
                   at(g, first * g_stride), g_stride, at(loss, first), at(dx1, first * d),
                   at(dx2, first * d), sq1 + first, sq2 + first);
    };
    std::vector<std::thread> threads;
    std::vector<int64_t> left;
    for (int64_t t = 0; t + 1 < n_threads; ++t) {
        try {
            threads.emplace_back(run, t);
        } catch (...) {
            left.push_back(t);
        }
    }
    run(n_threads - 1);
    for (int64_t t : left) run(t);
    for (auto& thread : threads) thread.join();
}

}  // namespace

#define CEK_ROWS(NAME, A, S)                                                                  \
    extern "C" __attribute__((visibility("default"))) void NAME(                              \
        const S* x1, const S* x2, int64_t n, int64_t d, const int8_t* label, A margin, A eps, \
        const A* g, int64_t g_stride, A* loss, S* dx1, S* dx2, A* sq1, A* sq2,                \
        int64_t n_threads) {                                                                  \
        rows_threaded<A, S>(x1, x2, n, d, label, margin, eps, g, g_stride, loss, dx1, dx2,    \
                            sq1, sq2, n_threads);                                             \
    }

// Half precision rounds float32 results to nearest even, overflow to inf: NumPy's float16 cast
// and cek.dtypes.from_float for bfloat16.
CEK_ROWS(cek_cpu_rows_f16, float, _Float16)
CEK_ROWS(cek_cpu_rows_bf16, float, uint16_t)
CEK_ROWS(cek_cpu_rows_f32, float, float)
CEK_ROWS(cek_cpu_rows_f64, double, double)
