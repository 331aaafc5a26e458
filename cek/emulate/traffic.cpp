// traffic.cpp: the runtime of the "traffic" flavour: runtime.cpp, plus hooks that count, per
// byte, the loads and stores a kernel makes to its array arguments. The flavour builds the
// kernel's code with -fsanitize=kernel-address and outlined checks, so that before every load and
// store of the optimised code (a scalar, or each piece a 16-byte vector access is really made
// of) g++ calls one of the __asan_*_noabort hooks below with its address. KASAN, unlike ASan,
// has no runtime library: the build supplies these functions, so here they count instead of
// checking. This file is not instrumented itself.
//
// Only addresses inside a watched array count: shared memory (thread_local), the fibers' stacks
// and the runtime's own memory are not global traffic. An array argument passed as None is
// watched at address 0 over the bytes it would have had: any access to it fails the launch.
#include "runtime.cpp"

// One array argument: `reads` and `writes` hold a counter per byte, both null for a None one.
struct CekWatched {
    const char* name;
    unsigned long base, size;
    unsigned* reads;
    unsigned* writes;
};

static const int kMaxWatched = 16;
static CekWatched g_watched[kMaxWatched];
static int g_n_watched;
static unsigned long g_low, g_high;  // the span of all watched bytes, a quick test for the rest

// Watches `n` arrays until the next call (n = 0: none). The caller holds the library's lock.
EXPORT int cek_traffic_watch(int n, const CekWatched* watched) {
    if (n < 0 || n > kMaxWatched) return 1;
    g_n_watched = n;
    g_low = ~0ul;
    g_high = 0;
    for (int i = 0; i < n; ++i) {
        g_watched[i] = watched[i];
        if (watched[i].base < g_low) g_low = watched[i].base;
        if (watched[i].base + watched[i].size > g_high) g_high = watched[i].base + watched[i].size;
    }
    return 0;
}

// Fails the launch and stops the thread before the access is made, as a misaligned one does.
__attribute__((format(printf, 1, 2))) [[noreturn]] static void refuse(const char* fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fail(nullptr, 0, "%s, by %s", what, g_current ? describe(g_current) : "the host");
    if (!g_current) abort();
    abort_fiber();
}

static void count(unsigned long address, unsigned long size, bool write) {
    const unsigned long end = address + size;
    if (end <= g_low || address >= g_high) return;
    for (int i = 0; i < g_n_watched; ++i) {
        const CekWatched& w = g_watched[i];
        const unsigned long from = address > w.base ? address : w.base;
        const unsigned long to = end < w.base + w.size ? end : w.base + w.size;
        if (from >= to) continue;
        if (!w.reads)
            refuse("%s %s, which is None (a null pointer)", write ? "writes" : "reads", w.name);
        unsigned* counter = (write ? w.writes : w.reads) + (from - w.base);
        for (unsigned long a = from; a < to; ++a) ++*counter++;
    }
}

#define CEK_HOOKS(n)                                                                    \
    extern "C" void __asan_load##n##_noabort(unsigned long a) { count(a, n, false); } \
    extern "C" void __asan_store##n##_noabort(unsigned long a) { count(a, n, true); }
CEK_HOOKS(1)
CEK_HOOKS(2)
CEK_HOOKS(4)
CEK_HOOKS(8)
CEK_HOOKS(16)
extern "C" void __asan_loadN_noabort(unsigned long a, unsigned long n) { count(a, n, false); }
extern "C" void __asan_storeN_noabort(unsigned long a, unsigned long n) { count(a, n, true); }
extern "C" void __asan_handle_no_return() {}

// A memcpy, memmove or memset that g++ emits as a call (a copy of unknown size) is not
// instrumented: KASAN expects the kernel's own, checked versions. The flavour links with --wrap
// for all three, so such a call that touches a watched array fails the launch instead of going
// uncounted. The runtime's own calls (fiber setup, shared memory) pass through here too.
extern "C" {
void* __real_memcpy(void* to, const void* from, size_t n);
void* __real_memmove(void* to, const void* from, size_t n);
void* __real_memset(void* to, int byte, size_t n);
}

static void uncounted(const char* what, const void* p, size_t n) {
    const unsigned long a = reinterpret_cast<unsigned long>(p);
    if (n == 0 || a + n <= g_low || a >= g_high) return;
    for (int i = 0; i < g_n_watched; ++i)
        if (a < g_watched[i].base + g_watched[i].size && g_watched[i].base < a + n)
            refuse("calls %s on %s, whose bytes it would move uncounted", what,
                   g_watched[i].name);
}

extern "C" void* __wrap_memcpy(void* to, const void* from, size_t n) {
    uncounted("memcpy", to, n);
    uncounted("memcpy", from, n);
    return __real_memcpy(to, from, n);
}
extern "C" void* __wrap_memmove(void* to, const void* from, size_t n) {
    uncounted("memmove", to, n);
    uncounted("memmove", from, n);
    return __real_memmove(to, from, n);
}
extern "C" void* __wrap_memset(void* to, int byte, size_t n) {
    uncounted("memset", to, n);
    return __real_memset(to, byte, n);
}
