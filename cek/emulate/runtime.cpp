// runtime.cpp: runs one launch of an emulated kernel. Blocks run one after another; the threads
// of a block run as fibers on the calling OS thread and switch only at __syncthreads, at a
// shuffle and at exit, so a launch is deterministic and a deadlock shows the moment no fiber
// can run. The order in which runnable fibers resume is the launch's schedule.
//
// Built once per flavour (plain, CEK_TSAN, CEK_ASAN) and linked into every kernel library. It is
// not instrumented itself: it only tells the sanitizers about fibers and synchronisation.
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prelude.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

// Defined by the generated translation unit of each kernel library.
extern "C" void cek_kernel_entry(void** args);
extern "C" unsigned char* cek_dynamic_shared(void);  // null when the kernel declares none
extern "C" int cek_flush_subnormals(void);           // 1 for kernels that compute in float

#ifdef CEK_TSAN
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_set_fiber_name(void* fiber, const char* name);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}
// A switch between fibers is not synchronisation on a GPU; only barriers and shuffles are.
static const unsigned kTsanNoSync = 1;
#define TSAN(...) __VA_ARGS__
#else
#define TSAN(...)
#endif

#ifdef CEK_ASAN
extern "C" {
void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                     size_t* size_old);
void __asan_poison_memory_region(const volatile void* addr, size_t size);
void __asan_unpoison_memory_region(const volatile void* addr, size_t size);
}
#define ASAN(...) __VA_ARGS__
#else
#define ASAN(...)
#endif

static const int kMaxThreads = 1024;
static const int kWarp = 32;
static const unsigned long kDynamicSharedCapacity = 48 * 1024;  // CUDA's default limit
#if defined(CEK_TSAN) || defined(CEK_ASAN)
static const size_t kStackSize = 256 * 1024;  // sanitizer reports run on the fiber's stack
#else
static const size_t kStackSize = 64 * 1024;
#endif

// ---- context switch ---------------------------------------------------------------------------

#if defined(__x86_64__) && !defined(CEK_UCONTEXT)  // -DCEK_UCONTEXT tests the fallback
// Saves the callee-saved registers on the current stack, swaps stack pointers, restores. The
// MXCSR and x87 control words are not saved: kernel code never changes them.
extern "C" void cek_switch(void** save_sp, void* to_sp);
asm(R"(
    .text
    .p2align 4
    .hidden cek_switch
    .type cek_switch, @function
cek_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cek_switch, .-cek_switch
)");

struct Context {
    void* sp;
};
static void switch_context(Context* from, Context* to) { cek_switch(&from->sp, to->sp); }
static void make_context(Context* ctx, char* stack, size_t size, void (*entry)()) {
    void** sp = reinterpret_cast<void**>(stack + size);  // 16-byte aligned
    *--sp = nullptr;                                     // entry's return address: none
    *--sp = reinterpret_cast<void*>(entry);              // where cek_switch's ret lands
    for (int i = 0; i < 6; ++i) *--sp = nullptr;         // rbp rbx r12 r13 r14 r15
    ctx->sp = sp;
}
#else
#include <ucontext.h>
struct Context {
    ucontext_t uc;
};
static void switch_context(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
static void make_context(Context* ctx, char* stack, size_t size, void (*entry)()) {
    getcontext(&ctx->uc);
    ctx->uc.uc_stack.ss_sp = stack;
    ctx->uc.uc_stack.ss_size = size;
    ctx->uc.uc_link = nullptr;
    makecontext(&ctx->uc, entry, 0);
}
#endif

// ---- state of the launch ----------------------------------------------------------------------

enum State { RUNNABLE, AT_BARRIER, AT_SHUFFLE, EXITED };

// The path that reached a barrier or a shuffle: the return addresses of the frames on the
// fiber's stack, innermost first (see call_path).
static const int kMaxPath = 32;
struct Path {
    int depth;
    void* pc[kMaxPath];
};

struct Fiber {
    Context ctx;
    char* stack;
    uint3 idx;
    int tid;
    State state;
    // The pending shuffle: this lane's value, then the value it receives.
    unsigned long long bits;
    int src;  // lane read, -1 for its own value
    Path path;  // the path to the barrier or shuffle it waits at
    TSAN(void* tsan;)
    ASAN(void* fake_stack;)
};

struct Warp {
    int arrived;
    unsigned mask;
    const char* file;
    int line;
    const Path* path;  // the first lane's, which waits there until the shuffle completes
    unsigned generation;
    TSAN(char sync[2];)
};

extern "C" {
const uint3* cek_thread_idx;
uint3 cek_block_idx;
dim3 cek_block_dim, cek_grid_dim;
}

static Fiber* g_fibers;
static Fiber* g_current;
static Context g_scheduler;
static void** g_args;
static int g_threads, g_exited, g_at_barrier;
static const char* g_barrier_file;
static int g_barrier_line;
static const Path* g_barrier_path;  // the first thread's, which waits there
static unsigned g_barrier_generation;
static Warp g_warps[kMaxThreads / kWarp];
static bool g_failed;
static char g_error[4096];
TSAN(static void* g_tsan_scheduler; static char g_tsan_barrier[2]; static char g_tsan_block_start;
     static char g_tsan_block_end;)
ASAN(static void* g_asan_fake_stack; static const void* g_asan_stack; static size_t g_asan_size;)

static void fail(const char* file, int line, const char* fmt, ...) {
    if (g_failed) return;
    g_failed = true;
    int n = file ? snprintf(g_error, sizeof g_error, "%s:%d: ", file, line) : 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error + n, sizeof g_error - n, fmt, ap);
    va_end(ap);
}

static const char* describe(const Fiber* f) {
    static char text[128];
    snprintf(text, sizeof text, "thread (%u,%u,%u) of block (%u,%u,%u)", f->idx.x, f->idx.y,
             f->idx.z, cek_block_idx.x, cek_block_idx.y, cek_block_idx.z);
    return text;
}

// ---- call paths -------------------------------------------------------------------------------

// A barrier or shuffle site is its source line and the path that reached it. On a GPU each
// inlined copy of a helper is an instruction of its own, and threads at two copies of one
// __syncthreads or __shfl_xor_sync (a helper called from both arms of a branch) do not meet.
// g++ inlines alike, so the return address of the call into this runtime tells the copies apart,
// and the return addresses of the frames above it (kernel code is built with frame pointers)
// the callers g++ did not inline. The walk stays inside the fiber's stack.
__attribute__((always_inline)) static inline void call_path(Path* path) {
    const char* low = g_current->stack;
    const char* high = low + kStackSize;
    void** frame = static_cast<void**>(__builtin_frame_address(0));
    path->depth = 0;
    while (path->depth < kMaxPath && reinterpret_cast<char*>(frame) >= low &&
           reinterpret_cast<char*>(frame + 2) <= high && frame[1]) {
        path->pc[path->depth++] = frame[1];
        void** next = static_cast<void**>(frame[0]);
        if (next <= frame) break;
        frame = next;
    }
}

extern char** environ;

// addr2line's output for `address` in `library`, read through a pipe; nullptr when it cannot be
// started. No shell between: a library path may hold any character (a quote in a home folder).
static FILE* addr2line(const char* library, unsigned long address, pid_t* child) {
    char hex[32];
    snprintf(hex, sizeof hex, "%lx", address);
    int ends[2];
    if (pipe(ends) != 0) return nullptr;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, ends[1], 1);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addclose(&actions, ends[0]);
    posix_spawn_file_actions_addclose(&actions, ends[1]);
    char* argv[] = {const_cast<char*>("addr2line"), const_cast<char*>("-i"),
                    const_cast<char*>("-e"), const_cast<char*>(library), hex, nullptr};
    const int failed = posix_spawnp(child, "addr2line", &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(ends[1]);
    if (failed) {
        close(ends[0]);
        return nullptr;
    }
    return fdopen(ends[0], "r");
}

// The kernel source lines of one return address, innermost first ("a.cuh:243;b.cu:92;"), from
// the library's line tables (addr2line -i); "" where they cannot be read. Cached by address.
struct SourceLines {
    void* pc;
    char text[1024];
};
static SourceLines g_source_lines[512];
static int g_n_source_lines;

static const char* source_lines(void* pc) {
    for (int i = 0; i < g_n_source_lines; ++i)
        if (g_source_lines[i].pc == pc) return g_source_lines[i].text;
    SourceLines* entry = g_n_source_lines < 512 ? &g_source_lines[g_n_source_lines++] : nullptr;
    static char scratch[1024];
    char* text = entry ? entry->text : scratch;
    text[0] = 0;
    if (entry) entry->pc = pc;
    Dl_info info;
    if (!dladdr(pc, &info) || !info.dli_fname) return text;
    // One byte back: the return address is the instruction after the call.
    pid_t child;
    FILE* out = addr2line(info.dli_fname,
                          static_cast<unsigned long>(static_cast<char*>(pc) - 1 -
                                                     static_cast<char*>(info.dli_fbase)),
                          &child);
    if (!out) return text;
    char line[1024];
    size_t used = 0;
    while (fgets(line, sizeof line, out)) {
        char* colon = strrchr(line, ':');
        if (!colon) continue;
        *colon = 0;
        const size_t n = strlen(line);
        const bool kernel = (n > 3 && strcmp(line + n - 3, ".cu") == 0) ||
                            (n > 4 && strcmp(line + n - 4, ".cuh") == 0);
        *colon = ':';
        char* end = colon + 1 + strspn(colon + 1, "0123456789");
        *end = ';';
        // Copied by hand, as text_equal compares: under ThreadSanitizer the string functions
        // are intercepted, and a fiber reading what another fiber wrote would be a race.
        for (const char* c = line; kernel && c <= end && used + 1 < sizeof line; ++c)
            text[used++] = *c;
        text[used] = 0;
    }
    fclose(out);
    int status;
    waitpid(child, &status, 0);
    return text;
}

static bool text_equal(const char* a, const char* b) {
    while (*a && *a == *b) ++a, ++b;
    return *a == *b;
}

// Two paths of different addresses can still be one path of the source: g++ copies code that
// lies between two tests of one condition into both branches (jump threading), so threads that
// the source keeps together reach two copies of a shuffle. They are one site when every address
// names the same source lines; a helper called from two lines is two sites either way. Where
// the lines of an address cannot be read (no addr2line on the PATH, a library without line
// tables), the two are not known to differ: the site is its source line alone, as it was before
// paths, rather than a divergence reported in a correct kernel.
static bool same_source(const Path& a, const Path& b) {
    if (a.depth != b.depth) return false;
    for (int i = 0; i < a.depth; ++i) {
        if (a.pc[i] == b.pc[i]) continue;
        const char* lines = source_lines(a.pc[i]);
        const char* other = source_lines(b.pc[i]);
        if (lines[0] && other[0] && !text_equal(lines, other)) return false;
    }
    return true;
}

// A loop, not memcmp: under ThreadSanitizer memcmp is intercepted, and one fiber reading the
// path another fiber wrote would be called a race.
static bool same_path(const Path& a, const Path& b) {
    bool same = a.depth == b.depth;
    for (int i = 0; same && i < a.depth; ++i) same = a.pc[i] == b.pc[i];
    return same || same_source(a, b);
}

// A path as a token that KernelError (cek/emulate/errors.py) turns into the source lines of the
// callers: " {cek-path <library> <file>:<line> <offset>,<offset>...}", tab-separated (a path may
// hold spaces), with the site's own line and offsets into the kernel's library.
static const char* path_token(const Path& path, const char* file, int line, char* text,
                              size_t size) {
    Dl_info info;
    if (path.depth == 0 || !dladdr(path.pc[0], &info) || !info.dli_fname) return "";
    int n = snprintf(text, size, " {cek-path\t%s\t%s:%d\t", info.dli_fname, file, line);
    for (int i = 0; i < path.depth && n > 0 && static_cast<size_t>(n) < size; ++i)
        n += snprintf(text + n, size - n, "%s%lx", i ? "," : "",
                      static_cast<unsigned long>(static_cast<char*>(path.pc[i]) -
                                                 static_cast<char*>(info.dli_fbase)));
    if (n > 0 && static_cast<size_t>(n) < size) snprintf(text + n, size - n, "}");
    return text;
}

// ---- fibers -----------------------------------------------------------------------------------

// Back to the scheduler. A fiber that has exited or failed is never resumed: its stack is reset
// when the next block starts.
static void yield(bool dying) {
    Fiber* f = g_current;
    ASAN(__sanitizer_start_switch_fiber(dying ? nullptr : &f->fake_stack, g_asan_stack,
                                        g_asan_size);)
    TSAN(__tsan_switch_to_fiber(g_tsan_scheduler, kTsanNoSync);)
    switch_context(&f->ctx, &g_scheduler);
    ASAN(__sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);)
}

[[noreturn]] static void abort_fiber() {
    yield(true);
    abort();  // unreachable: a failed fiber is never resumed
}

static void fiber_main() {
    ASAN(__sanitizer_finish_switch_fiber(nullptr, &g_asan_stack, &g_asan_size);)
    TSAN(__tsan_acquire(&g_tsan_block_start);)
    cek_kernel_entry(g_args);
    TSAN(__tsan_release(&g_tsan_block_end);)
    g_current->state = EXITED;
    ++g_exited;
    abort_fiber();
}

static void resume(Fiber* f) {
    g_current = f;
    cek_thread_idx = &f->idx;
    ASAN(__sanitizer_start_switch_fiber(&g_asan_fake_stack, f->stack, kStackSize);)
    TSAN(__tsan_switch_to_fiber(f->tsan, kTsanNoSync);)
    switch_context(&g_scheduler, &f->ctx);
    ASAN(__sanitizer_finish_switch_fiber(g_asan_fake_stack, &g_asan_stack, &g_asan_size);)
    g_current = nullptr;
}

// The fibers' stacks are one mapping, made the first time a block needs them and reused by every
// later block: one mapping per library rather than one (plus a guard page) per fiber, since a
// process that loads a few dozen kernel libraries would otherwise run out of memory mappings
// (vm.max_map_count). MAP_NORESERVE: only the pages a fiber touches cost memory. The mapping is
// made by a raw system call: ThreadSanitizer's mmap interceptor clears the shadow of every new
// mapping, which for a 1024-thread block of sanitizer-sized stacks costs seconds.
static bool allocate_fibers(int n) {
    static int allocated = 0;
    static char* stacks = nullptr;
    if (!g_fibers) g_fibers = static_cast<Fiber*>(calloc(kMaxThreads, sizeof(Fiber)));
    if (!g_fibers) return false;
    if (!stacks) {
        void* p = reinterpret_cast<void*>(syscall(SYS_mmap, nullptr, kMaxThreads * kStackSize,
                                                  PROT_READ | PROT_WRITE,
                                                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                                                  0));
        if (p == MAP_FAILED) return false;
        stacks = static_cast<char*>(p);
    }
    for (; allocated < n; ++allocated) {
        g_fibers[allocated].stack = stacks + allocated * kStackSize;
        TSAN(g_fibers[allocated].tsan = __tsan_create_fiber(0);)
    }
    return true;
}

// ---- __syncthreads ----------------------------------------------------------------------------

extern "C" void cek_syncthreads(const char* file, int line) {
    Fiber* f = g_current;
    call_path(&f->path);
    if (!g_barrier_file) {
        g_barrier_file = file;
        g_barrier_line = line;
        g_barrier_path = &f->path;
    } else if (line != g_barrier_line || strcmp(file, g_barrier_file) != 0 ||
               !same_path(f->path, *g_barrier_path)) {
        char here[1024], there[1024];
        fail(file, line,
             "divergent __syncthreads: %s waits here%s while other threads wait at %s:%d%s",
             describe(f), path_token(f->path, file, line, here, sizeof here), g_barrier_file,
             g_barrier_line,
             path_token(*g_barrier_path, g_barrier_file, g_barrier_line, there, sizeof there));
        abort_fiber();
    }
    f->state = AT_BARRIER;
    ++g_at_barrier;
    TSAN(char* sync = &g_tsan_barrier[g_barrier_generation & 1]; __tsan_release(sync);)
    yield(false);
    TSAN(__tsan_acquire(sync);)
}

// All live threads are at the barrier: release them, unless one has exited, which PTX counts
// as arrived but which almost always means a thread skipped a barrier the others wait at.
static void complete_barrier() {
    if (g_at_barrier == 0 || g_at_barrier != g_threads - g_exited) return;
    if (g_exited > 0) {
        for (int t = 0; t < g_threads; ++t)
            if (g_fibers[t].state == EXITED) {
                fail(g_barrier_file, g_barrier_line,
                     "__syncthreads completed while %s had already exited (%d of %d threads "
                     "exited before the barrier)",
                     describe(&g_fibers[t]), g_exited, g_threads);
                return;
            }
    }
    for (int t = 0; t < g_threads; ++t) g_fibers[t].state = RUNNABLE;
    g_at_barrier = 0;
    g_barrier_file = nullptr;
    ++g_barrier_generation;
}

// ---- shuffles ---------------------------------------------------------------------------------

static const char* const kShuffleNames[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                            "__shfl_xor_sync"};

// The lane a shuffle reads, or -1 for its own value (CUDA's rules for each kind and width).
static int source_lane(int kind, int lane, int arg, int width) {
    const int segment = lane & ~(width - 1), offset = lane & (width - 1);
    switch (kind) {
        case CEK_SHFL_IDX: return segment + (arg & (width - 1));
        case CEK_SHFL_UP: return offset < arg ? -1 : lane - arg;
        case CEK_SHFL_DOWN: return offset + arg >= width ? -1 : lane + arg;
        default: {
            const int src = lane ^ arg;
            return src >= segment + width || src >= kWarp ? -1 : src;
        }
    }
}

extern "C" unsigned long long cek_shuffle(int kind, unsigned mask, unsigned long long bits,
                                          int lane_arg, int width, const char* file, int line) {
    Fiber* f = g_current;
    const int lane = f->tid % kWarp;
    Warp& w = g_warps[f->tid / kWarp];
    const char* name = kShuffleNames[kind];
    if (width < 1 || width > kWarp || (width & (width - 1))) {
        fail(file, line, "%s: width %d is not a power of two in [1, 32]", name, width);
        abort_fiber();
    }
    if (!(mask >> lane & 1u)) {
        fail(file, line, "%s: %s calls it with a mask 0x%08x that leaves out its own lane %d",
             name, describe(f), mask, lane);
        abort_fiber();
    }
    call_path(&f->path);
    if (w.arrived == 0) {
        w.mask = mask;
        w.file = file;
        w.line = line;
        w.path = &f->path;
    } else if (line != w.line || strcmp(file, w.file) != 0 || mask != w.mask ||
               !same_path(f->path, *w.path)) {
        char here[1024], there[1024];
        fail(file, line,
             "divergent shuffle: %s calls %s with mask 0x%08x here%s while lanes of its warp "
             "wait at %s:%d%s with mask 0x%08x",
             describe(f), name, mask, path_token(f->path, file, line, here, sizeof here),
             w.file, w.line, path_token(*w.path, w.file, w.line, there, sizeof there), w.mask);
        abort_fiber();
    }
    f->bits = bits;
    f->src = source_lane(kind, lane, lane_arg, width);
    f->state = AT_SHUFFLE;
    ++w.arrived;
    TSAN(char* sync = &w.sync[w.generation & 1]; __tsan_release(sync);)
    yield(false);
    TSAN(__tsan_acquire(sync);)
    return f->bits;
}

// A warp's shuffle completes when every lane of its mask that exists and has not exited is
// there. Reading any other lane is an error: on a GPU the value is undefined.
static void complete_shuffles() {
    const int n_warps = (g_threads + kWarp - 1) / kWarp;
    for (int wi = 0; wi < n_warps && !g_failed; ++wi) {
        Warp& w = g_warps[wi];
        if (w.arrived == 0) continue;
        Fiber* lanes = g_fibers + wi * kWarp;
        const int n_lanes = g_threads - wi * kWarp < kWarp ? g_threads - wi * kWarp : kWarp;
        unsigned live = 0;
        for (int l = 0; l < n_lanes; ++l)
            if ((w.mask >> l & 1u) && lanes[l].state != EXITED) live |= 1u << l;
        if (w.arrived != __builtin_popcount(live)) continue;
        unsigned long long received[kWarp];
        for (int l = 0; l < n_lanes; ++l) {
            if (!(live >> l & 1u)) continue;
            const int src = lanes[l].src;
            if (src < 0) {
                received[l] = lanes[l].bits;
            } else if (live >> src & 1u) {
                received[l] = lanes[src].bits;
            } else {
                const char* why = src >= n_lanes                  ? "does not exist"
                                  : !(w.mask >> src & 1u)         ? "is not in the mask"
                                  : lanes[src].state == EXITED    ? "has exited"
                                                                  : "is not at the shuffle";
                fail(w.file, w.line, "shuffle: %s reads lane %d of its warp, which %s",
                     describe(&lanes[l]), src, why);
                return;
            }
        }
        for (int l = 0; l < n_lanes; ++l) {
            if (!(live >> l & 1u)) continue;
            lanes[l].bits = received[l];
            lanes[l].state = RUNNABLE;
        }
        w.arrived = 0;
        ++w.generation;
    }
}

// ---- scheduling -------------------------------------------------------------------------------

enum Schedule { FORWARD, REVERSE, RANDOM };

static unsigned long long g_rng;
static unsigned long long next_random() {  // splitmix64
    unsigned long long z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void order(int* items, int n, int schedule) {
    if (schedule == REVERSE) {
        for (int i = 0; i < n / 2; ++i) {
            int t = items[i];
            items[i] = items[n - 1 - i];
            items[n - 1 - i] = t;
        }
    } else if (schedule == RANDOM) {
        for (int i = n - 1; i > 0; --i) {
            int j = static_cast<int>(next_random() % static_cast<unsigned long long>(i + 1));
            int t = items[i];
            items[i] = items[j];
            items[j] = t;
        }
    }
}

static void report_deadlock() {
    int at_barrier = -1, at_shuffle = -1;
    for (int t = 0; t < g_threads; ++t) {
        if (g_fibers[t].state == AT_BARRIER && at_barrier < 0) at_barrier = t;
        if (g_fibers[t].state == AT_SHUFFLE && at_shuffle < 0) at_shuffle = t;
    }
    char shuffle[512] = "";
    if (at_shuffle >= 0) {
        const Warp& w = g_warps[at_shuffle / kWarp];
        snprintf(shuffle, sizeof shuffle, "; %s waits at a shuffle at %s:%d (mask 0x%08x)",
                 describe(&g_fibers[at_shuffle]), w.file, w.line, w.mask);
    }
    if (at_barrier >= 0)
        fail(g_barrier_file, g_barrier_line,
             "deadlock: %d of %d threads wait at __syncthreads here and no thread can run%s",
             g_at_barrier, g_threads, shuffle);
    else
        fail(nullptr, 0, "deadlock: no thread can run%s", shuffle);
}

static void run_block(int schedule, int* runnable) {
    for (int t = 0; t < g_threads; ++t) {
        Fiber& f = g_fibers[t];
        f.tid = t;
        f.idx = uint3{t % cek_block_dim.x, t / cek_block_dim.x % cek_block_dim.y,
                      t / (cek_block_dim.x * cek_block_dim.y)};
        f.state = RUNNABLE;
        make_context(&f.ctx, f.stack, kStackSize, fiber_main);
    }
    memset(g_warps, 0, sizeof g_warps);
    g_exited = g_at_barrier = 0;
    g_barrier_file = nullptr;
    // One round resumes every runnable fiber once; it ends at a barrier, a shuffle or an exit.
    while (g_exited < g_threads) {
        int n = 0;
        for (int t = 0; t < g_threads; ++t)
            if (g_fibers[t].state == RUNNABLE) runnable[n++] = t;
        if (n == 0) return report_deadlock();
        order(runnable, n, schedule);
        for (int i = 0; i < n; ++i) {
            resume(&g_fibers[runnable[i]]);
            if (g_failed) return;
        }
        complete_barrier();
        if (g_failed) return;
        complete_shuffles();
        if (g_failed) return;
    }
}

// ---- shared memory ----------------------------------------------------------------------------

// Every __shared__ variable is a thread_local of this library, so this library's TLS block is
// exactly the kernel's shared memory. It is filled with 0xff bytes (a NaN as a float) before each
// block, so a value left by the previous block cannot make a missing barrier look harmless.
struct TlsBlock {
    unsigned char* base;
    size_t size;
};
struct TlsIndex {
    unsigned long module, offset;
};
extern "C" void* __tls_get_addr(TlsIndex*);

static int find_tls(struct dl_phdr_info* info, size_t, void* data) {
    Dl_info self;
    if (!dladdr(reinterpret_cast<void*>(&find_tls), &self) ||
        info->dlpi_addr != reinterpret_cast<ElfW(Addr)>(self.dli_fbase))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        if (info->dlpi_phdr[i].p_type != PT_TLS) continue;
        TlsIndex index = {info->dlpi_tls_modid, 0};
        auto* block = static_cast<TlsBlock*>(data);
        block->base = static_cast<unsigned char*>(__tls_get_addr(&index));
        block->size = info->dlpi_phdr[i].p_memsz;
    }
    return 1;
}

static void fill_shared(const TlsBlock& tls, unsigned char* dynamic, unsigned long shared_mem) {
    ASAN(if (dynamic) __asan_unpoison_memory_region(dynamic, kDynamicSharedCapacity);)
    if (tls.base) memset(tls.base, 0xff, tls.size);
    // Past the launch's shared_mem bytes the buffer is not the kernel's.
    ASAN(if (dynamic) __asan_poison_memory_region(dynamic + shared_mem,
                                                  kDynamicSharedCapacity - shared_mem);)
    (void)dynamic;
    (void)shared_mem;
}

// ---- the launch -------------------------------------------------------------------------------

static unsigned long gcd(unsigned long a, unsigned long b) {
    while (b) {
        unsigned long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static void block_index(unsigned long b, uint3* out) {
    out->x = b % cek_grid_dim.x;
    out->y = b / cek_grid_dim.x % cek_grid_dim.y;
    out->z = b / (static_cast<unsigned long>(cek_grid_dim.x) * cek_grid_dim.y);
}

// Returns 0, or 1 with the reason in `error`. Not reentrant: the caller holds a lock.
// CuPy compiles every kernel with -ftz=true: float32 arithmetic reads and writes subnormals as
// zero (double arithmetic is not affected). SSE has the same two switches in MXCSR (DAZ for
// inputs, FTZ for results), but they flush doubles too, so only kernels that compute in float
// turn them on, for the launch alone.
#if defined(__x86_64__)
static unsigned read_mxcsr() {
    unsigned value;
    asm volatile("stmxcsr %0" : "=m"(value));
    return value;
}
static void write_mxcsr(unsigned value) { asm volatile("ldmxcsr %0" : : "m"(value)); }
static const unsigned kFlushBits = 0x8040;  // FTZ (bit 15) | DAZ (bit 6)
#else
static unsigned read_mxcsr() { return 0; }  // elsewhere subnormals are kept: a documented gap
static void write_mxcsr(unsigned) {}
static const unsigned kFlushBits = 0;
#endif

// Set from another thread (the Python caller on Ctrl-C): the launch stops before its next block.
static volatile int g_stop;
EXPORT void cek_stop(int stop) { __atomic_store_n(&g_stop, stop, __ATOMIC_RELAXED); }

// Runs blocks first_block .. first_block + block_count - 1 (linear indices, x fastest; a
// block_count of 0: to the grid's end): a test can run the blocks that cover the last rows of a
// problem whose arrays it fills only there.
EXPORT int cek_launch(void** args, const unsigned* grid, const unsigned* block,
                      unsigned long shared_mem, int schedule, unsigned long long seed,
                      unsigned long first_block, unsigned long block_count, char* error,
                      unsigned long error_size) {
    g_failed = false;
    g_error[0] = 0;
    const unsigned mxcsr = read_mxcsr();
    if (cek_flush_subnormals()) write_mxcsr(mxcsr | kFlushBits);
    cek_grid_dim = dim3(grid[0], grid[1], grid[2]);
    cek_block_dim = dim3(block[0], block[1], block[2]);
    g_threads = static_cast<int>(block[0] * block[1] * block[2]);
    g_args = args;
    g_rng = seed;
    unsigned char* dynamic = cek_dynamic_shared();
    const unsigned long n_blocks = static_cast<unsigned long>(grid[0]) * grid[1] * grid[2];
    if (first_block >= n_blocks)
        fail(nullptr, 0, "first_block=%lu is not below the grid's %lu blocks", first_block,
             n_blocks);
    else if (block_count > n_blocks - first_block)
        fail(nullptr, 0, "blocks %lu .. %lu are past the grid's %lu blocks", first_block,
             first_block + block_count - 1, n_blocks);
    else if (g_threads < 1 || g_threads > kMaxThreads)
        fail(nullptr, 0, "a block of %d threads is outside [1, %d]", g_threads, kMaxThreads);
    else if (shared_mem > kDynamicSharedCapacity)
        fail(nullptr, 0, "shared_mem=%lu is over the %lu bytes of dynamic shared memory",
             shared_mem, kDynamicSharedCapacity);
    else if (!allocate_fibers(g_threads))
        fail(nullptr, 0, "cannot allocate fiber stacks");
    if (!g_failed) {
        TlsBlock tls = {nullptr, 0};
        dl_iterate_phdr(find_tls, &tls);
        TSAN(g_tsan_scheduler = __tsan_get_current_fiber();)
        int runnable[kMaxThreads];
        // The block order follows the schedule too, so that blocks racing on global memory give
        // different results under different schedules. The random order is b = a*i + c mod n
        // with a coprime to n: a permutation without a table of n entries.
        const unsigned long n = block_count ? block_count : n_blocks - first_block;
        unsigned long a = 1, c = 0;
        if (schedule == RANDOM && n > 1) {
            do a = 1 + next_random() % (n - 1);
            while (gcd(a, n) != 1);
            c = next_random() % n;
        }
        for (unsigned long i = 0; i < n && !g_failed; ++i) {
            if (__atomic_load_n(&g_stop, __ATOMIC_RELAXED)) {
                fail(nullptr, 0, "launch interrupted after %lu of %lu blocks", i, n);
                break;
            }
            const unsigned long b =
                schedule == REVERSE ? n - 1 - i
                : schedule == RANDOM
                    ? static_cast<unsigned long>((static_cast<unsigned __int128>(a) * i + c) % n)
                    : i;
            block_index(first_block + b, &cek_block_idx);
            fill_shared(tls, dynamic, shared_mem);
            TSAN(__tsan_release(&g_tsan_block_start);)
            run_block(schedule, runnable);
            TSAN(__tsan_acquire(&g_tsan_block_end);)
        }
        ASAN(if (dynamic) __asan_unpoison_memory_region(dynamic, kDynamicSharedCapacity);)
    }
    g_current = nullptr;
    cek_thread_idx = nullptr;
    write_mxcsr(mxcsr);
    snprintf(error, error_size, "%s", g_error);
    return g_failed ? 1 : 0;
}

// ---- misaligned accesses ----------------------------------------------------------------------

// The kernel is built with -fsanitize=alignment but not linked with libubsan: these handlers
// turn a report into a KernelError of the launch and stop the thread before the access faults.
struct SourceLocation {
    const char* file;
    unsigned line, column;
};
struct TypeDescriptor {
    unsigned short kind, info;
    char name[1];
};
struct TypeMismatchData {
    SourceLocation location;
    const TypeDescriptor* type;
    unsigned char log_alignment;
    unsigned char check_kind;
};

extern "C" void cek_misaligned(const void* p, unsigned long align, const char* what,
                               const char* file, int line) {
    fail(file, line, "misaligned %s of address %p, which needs %lu-byte alignment, by %s", what,
         p, align, g_current ? describe(g_current) : "the host");
    if (!g_current) abort();
    abort_fiber();
}

extern "C" void __ubsan_handle_type_mismatch_v1(TypeMismatchData* data, unsigned long pointer) {
    static const char* const kinds[] = {"load", "store", "reference binding", "member access",
                                        "member call", "constructor call"};
    const char* kind = data->check_kind < 6 ? kinds[data->check_kind] : "access";
    char what[256];
    snprintf(what, sizeof what, "%s of type %s", kind, data->type->name);
    cek_misaligned(reinterpret_cast<const void*>(pointer), 1ul << data->log_alignment, what,
                   data->location.file, static_cast<int>(data->location.line));
}

extern "C" void __ubsan_handle_type_mismatch_v1_abort(TypeMismatchData* data,
                                                      unsigned long pointer) {
    __ubsan_handle_type_mismatch_v1(data, pointer);
}
