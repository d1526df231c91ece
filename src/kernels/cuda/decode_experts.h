// The experts of a decode-size batch in one launch: gemm1 (+ SiLU-and-multiply), gemm2 (+ router
// weight) and the sum, with each distinct expert's weights read once (decode_experts.cu says how).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda {

// The most tokens and pairs one launch takes: a thread per pair numbers the distinct experts, and
// every token's partial sums stay in registers.
inline constexpr int64_t kDecodeMaxTokens = 8;
inline constexpr int64_t kDecodeMaxPairs = 128;

// 32-bit words of the launch's counters (next item, blocks done, one per slot). They must be zero
// before the first launch; every launch leaves them zero again.
inline constexpr int64_t kDecodeSyncWords = 2 + kDecodeMaxPairs;

struct DecodeArgs {
  const void* hidden = nullptr;         // bf16 [M, H]
  const void* w13 = nullptr;            // bf16 [E, 2I, H]
  const void* w2 = nullptr;             // bf16 [E, H, I]
  const float* topk_weights = nullptr;  // [M, k]
  const int32_t* topk_ids = nullptr;    // [M, k]; ids outside [0, E) add nothing
  int64_t num_tokens = 0;               // M, at most kDecodeMaxTokens
  int64_t top_k = 0;                    // M * k at most kDecodeMaxPairs
  int64_t num_experts = 0;              // E
  int64_t hidden_size = 0;              // H, a multiple of 8
  int64_t intermediate_size = 0;        // I, a multiple of 8
  void* act = nullptr;                  // bf16 [M * k, I] workspace
  uint32_t* sync = nullptr;             // kDecodeSyncWords workspace words
  void* out = nullptr;                  // bf16 [M, H]
  int max_multiprocessors = 0;          // as GroupedGemmArgs::max_multiprocessors; 0 = all
};

// Queues the launch on `stream`. hidden, w13, w2 and act must be 16-byte aligned.
void decode_experts(const DecodeArgs& args, cudaStream_t stream);

}  // namespace moe::cuda
