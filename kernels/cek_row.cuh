// cek_row.cuh: row tiling, loads/stores and reductions shared by the cosine embedding loss
// kernels, the one header they include. The loader inlines it and the headers below into each
// kernel's source, so a change in any of them changes every kernel's cache key.
//
// The headers, in the order they are included (each includes what it uses):
//   cek_tiling.cuh     how a row is cut into chunks and lanes: the three paths (CekTiling)
//   cek_chunk.cuh      16-byte chunks: loads and stores, conversions
//   cek_sums.cuh       a row's sums, over a row group or a block, and its cosine
//   cek_loss.cuh       a row's loss and gradient
//   cek_huge.cuh       huge rows, summed again rescaled
//   cek_stream.cuh     the streamed path's sums and gradient
//   cek_block_row.cuh  one block a row
//   cek_row_group.cuh  row groups
#pragma once

#include "cek_tiling.cuh"
#include "cek_chunk.cuh"
#include "cek_sums.cuh"
#include "cek_loss.cuh"
#include "cek_huge.cuh"
#include "cek_stream.cuh"
#include "cek_block_row.cuh"
#include "cek_row_group.cuh"
