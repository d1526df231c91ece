// The router GEMM on a bf16 tile kernel (the amx path): logits [M, E] = hidden [M, H] · weight
// [E, H]^T (+ bias) for a bf16 hidden and a bf16 router weight, the weight packed once into the
// experts' panel pairs (packed_weights.h, plain_layout(bf16, E, H)), each call 32 tokens by 32
// experts over the whole of H. The products of bf16 values are exact in f32, as on the f32 path
// (router_gemm.cc), which turns both inputs into f32 first; the sums follow the tile instruction's
// own order, so the logits differ from that path's in the last bits. Each logit depends only on
// its token's row and its expert's weights: not on the batch, the row's place in it or the threads.
// Tested in tests/routing/router_tiles_test.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/tile_kernel.h"
#include "moe/tensor.h"

namespace moe::cpu {

// Whether router_logits_tiles takes a layer of this hidden size: the kernel reads k in steps of
// kBf16KMultiple straight from the hidden rows, which have no zero padding to round H up.
bool router_tiles_fit(int64_t hidden_size);

// The bf16 router weight [num_experts, hidden_size] in panel pairs: u8 [layout.bytes()].
Tensor pack_router_tiles(const void* weight, int64_t num_experts, int64_t hidden_size,
                         int num_threads);

// Where a kernel's last, partial block of rows reads the tokens from: TileKernel::row_multiple
// rows of hidden_size bf16, zeros at first. The caller owns it so that a call allocates nothing.
std::vector<uint16_t> router_tiles_tail_buffer(const TileKernel& kernel, int64_t hidden_size);

// logits [num_tokens, num_experts] f32 from bf16 hidden [num_tokens, hidden_size] and
// pack_router_tiles' result; router_bias [num_experts] f32 or null; requires
// router_tiles_fit(hidden_size) and a bf16 tile kernel.
void router_logits_tiles(const TileKernel& kernel, const void* hidden, const void* packed,
                         const float* router_bias, int64_t num_tokens, int64_t hidden_size,
                         int64_t num_experts, std::vector<uint16_t>& tail, float* logits,
                         int num_threads);

}  // namespace moe::cpu
