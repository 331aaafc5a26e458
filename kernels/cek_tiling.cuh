// cek_tiling.cuh: how a row is cut into chunks and lanes (CekTiling) and the constants
// cek/tiling.py mirrors.
//
// Tiling. A row of n_dim elements of type T is cut into 16-byte chunks of VEC = 16 / sizeof(T)
// elements (chunk j covers [j*VEC, (j+1)*VEC)). The threads that own a row ("lanes") take chunks
// lane, lane + lanes, ... Three paths, fixed at compile time by BLOCK_SIZE =
// next_power_of_two(n_dim) and T, with ROW_CHUNKS = max(1, BLOCK_SIZE / VEC):
//   * register path, ROW_CHUNKS <= 4096 (2048 for 2-byte T, whose conversions need registers
//     too; either way rows of up to 16384 elements, 8192 doubles): one block per row; each
//     thread holds CHUNKS = max(1, ROW_CHUNKS / 1024) chunks (at least 2 for float and 16-bit
//     rows of 256 chunks and more: BLOCK_SIZE >= 1024 in float, >= 2048 in 16-bit types) in
//     registers between the reduction and the gradient write, so x1 and x2 are read once.
//     blockDim.x is the launcher's choice: the smallest multiple of 32 with blockDim.x * CHUNKS
//     * VEC >= n_dim (a 768-wide float row: 96 threads), but 672 where that is 704 or 736 at
//     BLOCK_SIZE 8192 in float (CekTiling::TAILED): a thread then holds one element past its
//     chunks.
//   * streamed path, above that: a row no longer fits in the 64 registers a thread may
//     use at 1024 threads, so 1024 threads loop over it, and a gradient kernel reads it twice.
//   * row groups (the fused kernel and the *_rows variants of forward and backward, ROW_CHUNKS
//     <= 64 and BLOCK_SIZE <= 256: 256 floats or halves, 128 doubles; and 16-bit rows of
//     BLOCK_SIZE 1024, four chunk pairs a lane, CEK_GROUPED_16_BIT_SIZE): GROUP = min(32,
//     ROW_CHUNKS) lanes of one warp own a row (half the chunks, two pairs a lane, for float and
//     16-bit rows of 2..32 chunks: CekTiling::GROUP), 256 threads a block, so a block holds
//     256 / GROUP rows and the reduction is warp shuffles only. One block per row would leave a
//     128-float row a one-warp block: too few warps per SM to keep enough loads in flight, and
//     a block launched for every 1 KB of input.
#pragma once

#include "cek_types.cuh"

constexpr int CEK_WARP = 32;
constexpr int CEK_MAX_THREADS = 1024;
// Float and 16-bit rows of this many chunks or more (BLOCK_SIZE >= 1024: 513 floats and up;
// BLOCK_SIZE >= 2048: 1025 16-bit values and up) take at least two chunk pairs a thread
// (CekTiling::MIN_CHUNKS).
constexpr int CEK_TWO_PAIRS_FROM_CHUNKS = 256;
constexpr int CEK_MAX_GROUPED_CHUNKS = 64;
// Row groups take rows of at most 256 elements too: a 16-bit lane holding two chunk pairs needs
// 56 registers (half the SM's threads), where one block per row of 257..512 halves runs 64
// threads of one pair at 32 registers (all of them).
constexpr int CEK_MAX_GROUPED_SIZE = 256;
// ... and 16-bit rows of 513..1024 (BLOCK_SIZE 1024): a warp a row, four chunk pairs a lane, at
// 64 registers (half an SM). One block per row ran them at one pair a thread, three or four warps
// a block, each thread issuing the block's sums and cosine for 16 bytes of a row: 62% of an
// H200's issue slots at the copy rate at D = 768 (fused). A warp a row needs no barrier and
// spreads that work over 64 bytes a lane: 43%, with 96 KB in flight an SM where 63 KB were.
constexpr int CEK_GROUPED_16_BIT_SIZE = 1024;
constexpr int CEK_MAX_BLOCK_SIZE = 1 << 20;
constexpr int CEK_GROUPED_THREADS = 256;

__host__ __device__ constexpr int cek_pow2_at_least(int n) {
    return n <= 1 ? 1 : 2 * cek_pow2_at_least((n + 1) / 2);
}

template <int BLOCK_SIZE, typename T>
struct CekTiling {
    static_assert(BLOCK_SIZE >= 1 && (BLOCK_SIZE & (BLOCK_SIZE - 1)) == 0,
                  "BLOCK_SIZE must be a power of two");
    static_assert(BLOCK_SIZE <= CEK_MAX_BLOCK_SIZE, "BLOCK_SIZE must be at most 2^20");
    static constexpr int VEC = CekVec<T>::N;
    static constexpr int ROW_CHUNKS = BLOCK_SIZE / VEC > 1 ? BLOCK_SIZE / VEC : 1;
    static constexpr int MAX_REGISTER_CHUNKS = sizeof(T) >= 4 ? 4096 : 2048;
    static constexpr bool STREAMED = ROW_CHUNKS > MAX_REGISTER_CHUNKS;
    static constexpr bool GROUPED =
        (ROW_CHUNKS <= CEK_MAX_GROUPED_CHUNKS && BLOCK_SIZE <= CEK_MAX_GROUPED_SIZE) ||
        (sizeof(T) == 2 && BLOCK_SIZE == CEK_GROUPED_16_BIT_SIZE);
    // Float rows of 256 chunks and more (513 floats and up) take two chunk pairs a thread, at the
    // 32 registers two float pairs fit since the huge-row path reads the row again:
    //  - 1024 chunks (2049..4096 floats): at most 512 threads a block. With one pair, blocks of
    //    683..1023 threads fit two an SM (67-100%; D = 3072: 75%), with two, blocks of 257..512
    //    threads fit four to seven (81-100%).
    //  - 256 and 512 chunks (513..2048 floats): a thread has 64 bytes in flight where one pair
    //    gave it 32, and the row's once-a-thread work (the block's sums, the cosine, the
    //    labels) is spread over twice the bytes. At D = 768 on sm_90: 96 threads a block, 21
    //    an SM (98%), 126 KB in flight an SM where 192 threads had 60 KB, 2.4 instructions a
    //    DRAM byte where they issued 3.9 (`cek compile --report`: 31% of the issue slots at the
    //    copy rate, where they took 50%).
    // 16-bit rows too, from 256 chunks (1025 values and up), at 40 registers (3/4 of an SM):
    //  their gradient widens the held chunks again by other instructions than the sums did
    //  (CekType::to_acc2_again), so that ptxas holds the 16-bit pairs through the block's
    //  reduction, not the floats widened from them (twice the registers: 56 to 64, half an SM).
    //  At D = 4096 in bfloat16 on sm_90: 256 threads a block, 96 KB in flight an SM where 512
    //  threads had 64 KB, 3.2 instructions a DRAM byte where they issued 5.0 (46% of the issue
    //  slots at the copy rate, where they took 64%). Not below 256 chunks: a 768-wide 16-bit
    //  row would run 48 threads, two warps, one of them half idle.
    static constexpr int MIN_CHUNKS =
        sizeof(T) <= 4 && sizeof(T) >= 2 && ROW_CHUNKS >= CEK_TWO_PAIRS_FROM_CHUNKS ? 2 : 1;
    static constexpr int CHUNKS =
        STREAMED ? 1
                 : ROW_CHUNKS / CEK_MAX_THREADS > MIN_CHUNKS ? ROW_CHUNKS / CEK_MAX_THREADS
                                                             : MIN_CHUNKS;
    // Float and 16-bit rows of 2..32 chunks take two chunk pairs a lane (ROW_CHUNKS / 2 lanes a
    // row): 64 bytes of loads a lane, and the row's shuffles and cosine over twice the bytes. At
    // D = 128 on sm_90 the fused kernel takes 26% (float) and 40% (bfloat16) of the issue slots
    // at the copy rate, with 97 KB in flight an SM, where one pair a lane took 43% and 53% with
    // 64 KB and 49 KB (40 registers, 75%, as the row groups of 256 floats had already).
    static constexpr int GROUP =
        ROW_CHUNKS > CEK_WARP ? CEK_WARP
        : ROW_CHUNKS >= 2 && sizeof(T) <= 4 && sizeof(T) >= 2 ? ROW_CHUNKS / 2
                                                               : ROW_CHUNKS;
    static constexpr int GROUP_CHUNKS = ROW_CHUNKS / GROUP;
    static constexpr int GROUPED_THREADS = CEK_GROUPED_THREADS;
    // The most threads a one-block-per-row launch takes (a row of BLOCK_SIZE elements): the
    // launcher's rule in cek/kernel.py, which the generated entry point checks against this.
    static constexpr int THREADS =
        STREAMED ? CEK_MAX_THREADS
                 : (ROW_CHUNKS / CHUNKS + CEK_WARP - 1) / CEK_WARP * CEK_WARP;
    // The most warps a block of this tiling has, rounded up to a power of two: the block
    // reduction's second shuffle levels (cek_block_sum).
    static constexpr int WARPS = cek_pow2_at_least(THREADS / CEK_WARP);
    // Blocks of 673..767 threads fit only two an SM (66-75% of its 2048 threads). Where a row
    // would take 704 or 736 (5377..5888 floats, BLOCK_SIZE 8192, 32 registers a thread) it
    // runs TAIL_THREADS, three an SM (98%), and each thread holds one element of the at most
    // MAX_TAIL past its chunks (cek_tail_element). Not for doubles: more than 32 registers a
    // thread hold them to two blocks of 672 anyway. Not for 16-bit rows either: two pairs a
    // thread, at most 512 threads.
    static constexpr bool TAILED = !STREAMED && sizeof(T) == 4 && BLOCK_SIZE == 8192;
    static constexpr int TAIL_THREADS = 672;
    static constexpr int MAX_TAIL = TAILED ? (736 - TAIL_THREADS) * CHUNKS * VEC : 0;
    static_assert(MAX_TAIL <= TAIL_THREADS, "a tailed row's thread holds one element at most");
};
