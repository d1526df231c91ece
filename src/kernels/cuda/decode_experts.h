// The experts of a decode-size batch in one launch: gemm1 (+ SiLU-and-multiply), gemm2 (+ router
// weight) and the sum, the tiny batch's two launches as items of one grid (decode_experts.cu says
// how). Up to kTinySumMaxTokens tokens each output is the tiny batch's, bit for bit.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda {

// The most tokens one launch takes: a counter per token tells its gemm2 items that its act rows
// are written.
inline constexpr int64_t kDecodeMaxTokens = 8;

// 32-bit words of the launch's counters (next item, blocks done, one per token). They must be
// zero before the first launch; every launch leaves them zero again.
inline constexpr int64_t kDecodeSyncWords = 2 + kDecodeMaxTokens;

struct DecodeArgs {
  const void* hidden = nullptr;         // bf16 [M, H]
  const void* w13 = nullptr;            // bf16 [E, 2I, H]
  const void* w2 = nullptr;             // bf16 [E, H, I]
  const float* topk_weights = nullptr;  // [M, k]
  const int32_t* topk_ids = nullptr;    // [M, k]; ids outside [0, E) add nothing
  int64_t num_tokens = 0;               // M, at most kDecodeMaxTokens
  int64_t top_k = 0;                    // k
  int64_t num_experts = 0;              // E
  int64_t hidden_size = 0;              // H, a multiple of 8
  int64_t intermediate_size = 0;        // I, a multiple of 8
  void* act = nullptr;                  // bf16 [M * k, I] workspace
  uint32_t* sync = nullptr;             // kDecodeSyncWords workspace words
  void* out = nullptr;                  // bf16 [M, H]
};

// Queues the launch on `stream`. hidden, w13, w2 and act must be 16-byte aligned.
void decode_experts(const DecodeArgs& args, cudaStream_t stream);

}  // namespace moe::cuda
