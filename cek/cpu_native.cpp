// The NumPy path's rows (cek/cpu.py), compiled: one pass over a row for its three sums, then
// one for its gradients while the row is still in cache, where NumPy needs about a dozen.
//
// Every operation is the one cek/cpu.py performs, in the same order and precision (built with
// -ffp-contract=off, so no multiply-add is fused), and the sums are NumPy's pairwise summation:
// the results are bitwise those of the NumPy code, which stays the fallback and the yardstick
// (tests/test_cpu_native.py). Rows whose squared norm would overflow are left to cek/cpu.py,
// which finds them from the sums written to sq1 and sq2.
//
// Storage types: float, double, _Float16, and bfloat16 as its uint16 bits (NumPy has no
// bfloat16). Half-precision elements are widened to float 8 at a time as they are read, and
// gradients rounded back 8 at a time as they are written: the values NumPy computes on its
// widened copies, without the copies.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

// Eight lanes of T. g++ vector arithmetic is lane by lane: the same operations as a loop over
// r[0..7], which g++ does not vectorise when it holds three such loops at once.
template <class T>
struct Lanes {
    typedef T type __attribute__((vector_size(8 * sizeof(T))));
};

template <class V, class T>
V load_lanes(const T* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// How elements of a storage type S are read as A and written back (8 at a time, or one).
template <class S>
struct Storage;

template <class A>
struct Plain {  // float and double: as they are
    using Acc = A;
    using V = typename Lanes<A>::type;
    static V load8(const A* p) { return load_lanes<V>(p); }
    static A load(const A* p) { return *p; }
    static void store8(A* p, V v) { std::memcpy(p, &v, sizeof v); }
    static void store(A* p, A v) { *p = v; }
};
template <>
struct Storage<float> : Plain<float> {};
template <>
struct Storage<double> : Plain<double> {};

// float16: F16C converts 8 (rounding to nearest even, overflow to inf, as NumPy's cast and
// g++'s scalar conversion, which is one element at a time).
template <>
struct Storage<_Float16> {
    using Acc = float;
    using V = Lanes<float>::type;
    static V load8(const _Float16* p) {
#if defined(__F16C__)
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        return load_lanes<V>(reinterpret_cast<const float*>(&v));
#else
        V v;
        for (int j = 0; j < 8; ++j) v[j] = float(p[j]);
        return v;
#endif
    }
    static float load(const _Float16* p) { return float(*p); }
    static void store8(_Float16* p, V v) {
#if defined(__F16C__)
        __m256 f;
        std::memcpy(&f, &v, sizeof v);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                         _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
#else
        for (int j = 0; j < 8; ++j) p[j] = _Float16(v[j]);
#endif
    }
    static void store(_Float16* p, float v) { *p = _Float16(v); }
};

// bfloat16 bits: the top half of a float32. Rounding is cek.dtypes' from_float (nearest even;
// a NaN keeps its top bits and is made quiet, so it stays NaN), in integers: AVX512-BF16's
// conversion would flush subnormals to zero.
template <>
struct Storage<uint16_t> {
    using Acc = float;
    using V = Lanes<float>::type;
    static uint32_t round(uint32_t bits) {
        bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
        return nan ? (bits >> 16) | 0x40u : (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    }
    static V load8(const uint16_t* p) {
#if defined(__AVX2__)
        __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
        return load_lanes<V>(reinterpret_cast<const float*>(&v));
#else
        V v;
        for (int j = 0; j < 8; ++j) v[j] = load(p + j);
        return v;
#endif
    }
    static float load(const uint16_t* p) {
        uint32_t bits = uint32_t(*p) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        return v;
    }
    static void store8(uint16_t* p, V v) {
#if defined(__AVX512BF16__) && defined(__AVX512VL__)
        // AVX512-BF16 rounds as this does, NaN included, but reads float32 subnormals as zero:
        // 8 values with one among them (a gradient below 1.2e-38) are rounded in integers.
        __m256 f;
        std::memcpy(&f, &v, sizeof v);
        __m256i size_less_1 = _mm256_sub_epi32(  // 0 wraps to 2^32 - 1
            _mm256_and_si256(_mm256_castps_si256(f), _mm256_set1_epi32(0x7FFFFFFF)),
            _mm256_set1_epi32(1));
        if (_mm256_cmplt_epu32_mask(size_less_1, _mm256_set1_epi32(0x7FFFFF)) == 0) {
            __m128bh h = _mm256_cvtneps_pbh(f);
            std::memcpy(p, &h, sizeof h);
            return;
        }
#endif
#if defined(__AVX2__)
        __m256i bits;
        std::memcpy(&bits, &v, sizeof v);
        __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
        __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lowest_kept), 16);
        __m256i nan = _mm256_cmpgt_epi32(  // signed compare: both sides are below 2^31
            _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
        __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
        __m256i result = _mm256_blendv_epi8(rounded, quiet, nan);
        // Every lane is below 2^16, so packing with unsigned saturation only drops the top halves.
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                         _mm_packus_epi32(_mm256_castsi256_si128(result),
                                          _mm256_extracti128_si256(result, 1)));
#else
        for (int j = 0; j < 8; ++j) store(p + j, v[j]);
#endif
    }
    static void store(uint16_t* p, float v) {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        *p = uint16_t(round(bits));
    }
};

// A row's three sums: sum a*a, sum b*b, sum a*b.
template <class A>
struct Sums {
    A sq1, sq2, dot;
};

// numpy/_core/src/umath/loops_utils.h.src, pairwise_sum, over the products each rounded to A
// (what np.add.reduce(a * b, axis=1) sums), for the three products of a row at once: each sum
// keeps NumPy's order, and the three independent chains keep the FPU busy where one would wait
// on its own additions. Blocks of up to 128 use 8 partial sums; longer runs split in two at a
// multiple of 8.
template <class S, class A = typename Storage<S>::Acc>
Sums<A> pairwise_sums(const S* a, const S* b, int64_t n) {
    using R = Storage<S>;
    if (n < 8) {
        A s1 = 0, s2 = 0, s12 = 0;
        for (int64_t i = 0; i < n; ++i) {
            A u = R::load(a + i), v = R::load(b + i);
            s1 += u * u;
            s2 += v * v;
            s12 += u * v;
        }
        return {s1, s2, s12};
    }
    if (n <= 128) {
        auto u = R::load8(a), v = R::load8(b);
        auto r1 = u * u, r2 = v * v, r12 = u * v;
        int64_t i = 8;
        for (; i < n - n % 8; i += 8) {
            u = R::load8(a + i);
            v = R::load8(b + i);
            r1 += u * u;
            r2 += v * v;
            r12 += u * v;
        }
        auto tree = [](const typename R::V& r) {
            return ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        };
        Sums<A> s{tree(r1), tree(r2), tree(r12)};
        for (; i < n; ++i) {
            A x = R::load(a + i), y = R::load(b + i);
            s.sq1 += x * x;
            s.sq2 += y * y;
            s.dot += x * y;
        }
        return s;
    }
    int64_t half = n / 2;
    half -= half % 8;
    Sums<A> x = pairwise_sums<S>(a, b, half), y = pairwise_sums<S>(a + half, b + half, n - half);
    return {x.sq1 + y.sq1, x.sq2 + y.sq2, x.dot + y.dot};
}

// dx1 = p*b - q1*a, dx2 = p*a - q2*b over [0, n): cek/cpu.py's two products and difference,
// rounded to S once.
template <class S, class A = typename Storage<S>::Acc>
void gradients(const S* a, const S* b, int64_t n, A p, A q1, A q2, S* out1, S* out2) {
    using R = Storage<S>;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        auto u = R::load8(a + j), v = R::load8(b + j);
        R::store8(out1 + j, v * p - u * q1);
        R::store8(out2 + j, u * p - v * q2);
    }
    for (; j < n; ++j) {
        A u = R::load(a + j), v = R::load(b + j);
        R::store(out1 + j, v * p - u * q1);
        R::store(out2 + j, u * p - v * q2);
    }
}

// Rows [0, n) of x1, x2 (S elements, accumulated in A). label: 1, -1 or 0 (any other label).
// g: the upstream gradient of row i at g[i * g_stride]. loss, dx1/dx2: null when not wanted.
template <class S, class A = typename Storage<S>::Acc>
void rows(const S* x1, const S* x2, int64_t n, int64_t d, const int8_t* label, A margin, A eps,
          const A* g, int64_t g_stride, A* loss, S* dx1, S* dx2, A* sq1_out, A* sq2_out) {
    for (int64_t i = 0; i < n; ++i) {
        const S* a = x1 + i * d;
        const S* b = x2 + i * d;
        Sums<A> s = pairwise_sums<S>(a, b, d);
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
        gradients<S>(a, b, d, p, q1, q2, dx1 + i * d, dx2 + i * d);
    }
}

// rows() over n_threads runs of consecutive rows, run t on thread t (the caller runs the last).
// Rows are independent, so the split changes no bit. Threads are started per call, which costs
// tens of microseconds (a Python thread pool costs about 0.3 ms); a thread that cannot be
// started leaves its run to the caller.
template <class S, class A = typename Storage<S>::Acc>
void rows_threaded(const S* x1, const S* x2, int64_t n, int64_t d, const int8_t* label,
                   A margin, A eps, const A* g, int64_t g_stride, A* loss, S* dx1, S* dx2,
                   A* sq1, A* sq2, int64_t n_threads) {
    auto run = [=](int64_t t) {
        int64_t first = n * t / n_threads, stop = n * (t + 1) / n_threads;
        auto at = [](auto* p, int64_t offset) { return p ? p + offset : p; };
        rows<S>(x1 + first * d, x2 + first * d, stop - first, d, label + first, margin, eps,
                at(g, first * g_stride), g_stride, at(loss, first), at(dx1, first * d),
                at(dx2, first * d), sq1 + first, sq2 + first);
    };
    if (n_threads < 1) n_threads = 1;
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
        rows_threaded<S>(x1, x2, n, d, label, margin, eps, g, g_stride, loss, dx1, dx2, sq1,  \
                         sq2, n_threads);                                                     \
    }

CEK_ROWS(cek_cpu_rows_f16, float, _Float16)
CEK_ROWS(cek_cpu_rows_bf16, float, uint16_t)
CEK_ROWS(cek_cpu_rows_f32, float, float)
CEK_ROWS(cek_cpu_rows_f64, double, double)
