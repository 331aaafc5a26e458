// prelude.h: the CUDA built-ins the emulator gives a kernel compiled by g++ for the CPU.
// It is force-included (g++ -include) ahead of the kernel's unmodified source. It includes no
// system header, so that each kernel build stays fast; anything it does not define fails to
// compile with g++'s own "was not declared" error at the kernel's file and line.
//
// SUBSET: what a kernel may use (the list printed in the README).
//   Qualifiers   __global__ __device__ __host__ __forceinline__ __restrict__
//                __launch_bounds__(...), templates, extern "C" entry points.
//   Indices      threadIdx blockIdx blockDim gridDim (uint3 / dim3).
//   Shared       static __shared__ (filled with 0xff bytes, a NaN for floats, before each block),
//                extern __shared__ T name[] (one buffer of the launch's shared_mem bytes).
//   Sync         __syncthreads(); __shfl_sync __shfl_xor_sync __shfl_down_sync __shfl_up_sync
//                (width defaults to 32), for values of at most 8 bytes; __all_sync.
//   Vectors      float2 float3 float4 int4 with make_*; CUDA alignment (float4 and int4: 16 bytes);
//                reinterpret_cast vector loads and stores; __ldg and __stcs of any of them or a
//                scalar.
//   Math         rsqrtf sqrtf sqrt (double) fmaxf fminf fmaf __fdividef __expf __logf;
//                __int_as_float __longlong_as_double;
//                atomicAdd on float, int and unsigned.
//   Memory       __threadfence() (a sequentially consistent fence: blocks run one after
//                another, so every store is visible to later blocks anyway).
// Semantics the emulator checks (each is a KernelError):
//   - a barrier that completes while a thread of the block has exited (exited threads count as
//     arrived, as in PTX, and so this is reported rather than hidden);
//   - two __syncthreads call sites in one phase; a shuffle whose lanes sit at different sites
//     or pass different masks. A site is a source line and the path of calls that reached it:
//     a helper called from two places is two sites, as each inlined copy is on a GPU, and the
//     message names both callers;
//   - a shuffle reading a lane that has exited, does not exist or is not in the mask;
//   - no runnable thread left (deadlock); a misaligned vector access (-fsanitize=alignment).
// A block of more threads than the entry point's __launch_bounds__ is refused before the launch
// (a ValueError naming both numbers), as the driver refuses it.
// Not emulated: spin-waits on memory (threads are never preempted, so one hangs the launch),
// warp-synchronous code without __*_sync, inline PTX (`asm`: guard it with #ifdef __CUDA_ARCH__
// and give a C++ fallback, as kernels/cek_types.cuh does), and anything not listed above.
#pragma once

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// A block-scope `thread_local` variable is static, and `extern thread_local` is legal C++ where
// `extern static` is not: one macro serves both static and dynamic shared memory. All threads of
// a block run as fibers on one OS thread, so they share it.
#define __shared__ thread_local

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct alignas(8) float2 {
    float x, y;
};
struct float3 {
    float x, y, z;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};

__device__ __forceinline__ float2 make_float2(float x, float y) { return {x, y}; }
__device__ __forceinline__ float3 make_float3(float x, float y, float z) { return {x, y, z}; }
__device__ __forceinline__ float4 make_float4(float x, float y, float z, float w) {
    return {x, y, z, w};
}
__device__ __forceinline__ int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }

// ---- the runtime (runtime.cpp) -------------------------------------------------------------

enum CekShuffleKind { CEK_SHFL_IDX, CEK_SHFL_UP, CEK_SHFL_DOWN, CEK_SHFL_XOR };

extern "C" {
extern const uint3* cek_thread_idx;  // the running fiber's index
extern uint3 cek_block_idx;
extern dim3 cek_block_dim, cek_grid_dim;
void cek_syncthreads(const char* file, int line);
unsigned long long cek_shuffle(int kind, unsigned mask, unsigned long long bits, int lane_arg,
                               int width, const char* file, int line);
[[noreturn]] void cek_misaligned(const void* p, unsigned long align, const char* what,
                                 const char* file, int line);
}

#define threadIdx (*cek_thread_idx)
#define blockIdx (static_cast<const uint3&>(cek_block_idx))
#define blockDim (static_cast<const dim3&>(cek_block_dim))
#define gridDim (static_cast<const dim3&>(cek_grid_dim))

// A macro so that the barrier knows its call site: two sites in one phase is a divergence.
#define __syncthreads() cek_syncthreads(__FILE__, __LINE__)

// Shuffles: the call site comes in through default arguments evaluated at the caller.
template <class T>
__device__ __forceinline__ T cek_shuffle_as(int kind, unsigned mask, T var, int lane_arg,
                                            int width, const char* file, int line) {
    static_assert(sizeof(T) <= 8, "the emulator shuffles values of at most 8 bytes");
    unsigned long long bits = 0;
    __builtin_memcpy(&bits, &var, sizeof(T));
    bits = cek_shuffle(kind, mask, bits, lane_arg, width, file, line);
    __builtin_memcpy(&var, &bits, sizeof(T));
    return var;
}
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return cek_shuffle_as(CEK_SHFL_IDX, mask, var, src_lane, width, file, line);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                 const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return cek_shuffle_as(CEK_SHFL_UP, mask, var, int(delta), width, file, line);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return cek_shuffle_as(CEK_SHFL_DOWN, mask, var, int(delta), width, file, line);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                  const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    return cek_shuffle_as(CEK_SHFL_XOR, mask, var, lane_mask, width, file, line);
}

// A warp vote, built from xor shuffles: every lane of the mask must call it, as on the GPU.
__device__ __forceinline__ int __all_sync(unsigned mask, int predicate,
                                          const char* file = __builtin_FILE(),
                                          int line = __builtin_LINE()) {
    unsigned long long all = predicate != 0;
    for (int offset = 16; offset > 0; offset >>= 1)
        all &= cek_shuffle(CEK_SHFL_XOR, mask, all, offset, 32, file, line);
    return static_cast<int>(all);
}

// __ldg checks alignment itself: -fsanitize=alignment would name this header, not the caller.
template <class T>
__device__ __forceinline__ T __ldg(const T* p, const char* file = __builtin_FILE(),
                                   int line = __builtin_LINE()) {
    if (reinterpret_cast<unsigned long>(p) % alignof(T) != 0)
        cek_misaligned(p, alignof(T), "__ldg", file, line);
    return *p;
}

// A store with the evict-first hint (st.global.cs): a plain store here, alignment checked.
template <class T>
__device__ __forceinline__ void __stcs(T* p, T value, const char* file = __builtin_FILE(),
                                       int line = __builtin_LINE()) {
    if (reinterpret_cast<unsigned long>(p) % alignof(T) != 0)
        cek_misaligned(p, alignof(T), "__stcs", file, line);
    *p = value;
}

// ---- math: libm's names, which g++ treats as builtins (inline with -fno-math-errno) -------

extern "C" {
double sqrt(double) noexcept;
float sqrtf(float) noexcept;
float fmaxf(float, float) noexcept;
float fminf(float, float) noexcept;
float fmaf(float, float, float) noexcept;
float expf(float) noexcept;
float logf(float) noexcept;
}
// CUDA's fast versions are approximations; the emulator computes them exactly, so a test
// tolerance must cover the GPU's error, not the emulator's.
__device__ __forceinline__ float rsqrtf(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ float __fdividef(float a, float b) { return a / b; }
__device__ __forceinline__ float __expf(float x) { return expf(x); }
__device__ __forceinline__ float __logf(float x) { return logf(x); }
__device__ __forceinline__ float __int_as_float(int bits) {
    return __builtin_bit_cast(float, bits);
}
__device__ __forceinline__ double __longlong_as_double(long long bits) {
    return __builtin_bit_cast(double, bits);
}

// Fibers never preempt one another, but relaxed atomics (as CUDA's are) keep ThreadSanitizer
// from calling two atomicAdds a race while still reporting a plain access that races with one.
__device__ __forceinline__ int atomicAdd(int* address, int val) {
    return __atomic_fetch_add(address, val, __ATOMIC_RELAXED);
}
__device__ __forceinline__ unsigned atomicAdd(unsigned* address, unsigned val) {
    return __atomic_fetch_add(address, val, __ATOMIC_RELAXED);
}
__device__ __forceinline__ float atomicAdd(float* address, float val) {
    float old, sum;
    __atomic_load(address, &old, __ATOMIC_RELAXED);
    do {
        sum = old + val;
    } while (!__atomic_compare_exchange(address, &old, &sum, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
    return old;
}

__device__ __forceinline__ void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
