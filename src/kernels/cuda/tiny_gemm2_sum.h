// gemm2 and the sum of a tiny batch in one launch:
//
//   out[t] = sum over j ascending of topk_weights[t, j] * (cache2[t * k + j] · w2[e_j]^T)
//
// where e_j = topk_ids[t, j]; pairs whose id lies outside [0, E) add nothing; no expert map (the
// tiny batch has none). Instead of gemm2 writing a cache3 row per pair for the sum's launch to
// read back, the warps of one thread block take a token's pairs and add them in a fixed order:
// no cache3, one launch fewer, the same bits every run (tiny_gemm2_sum.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda {

struct TinyGemm2SumArgs {
  const void* cache2 = nullptr;         // bf16 [M * k, I]: gemm1's output, rows in pair order
  const void* w2 = nullptr;             // bf16 [E, H, I]
  const float* topk_weights = nullptr;  // [M, k]
  const int32_t* topk_ids = nullptr;    // [M, k]
  int64_t num_experts = 0;              // E
  int64_t num_tokens = 0;               // M
  int64_t top_k = 0;                    // k
  int64_t hidden_size = 0;              // H
  int64_t intermediate_size = 0;        // I
  void* out = nullptr;                  // bf16 [M, H]
};

void tiny_gemm2_sum(const TinyGemm2SumArgs& args, cudaStream_t stream);

}  // namespace moe::cuda
