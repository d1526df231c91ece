// A layer's expert weights in the packed layout (packed_weights.h), built once at load time; the
// layer keeps only this copy. PackedExpertsView is what the kernels read: one pointer per expert,
// so the same kernels run on a layer's packed weights or on the experts a single call packs.
// Tested by tests/kernels/packed_weights_test.cc.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/packed_weights.h"
#include "kernels/experts_problem.h"
#include "moe/tensor.h"

namespace moe::cpu {

struct PackedExpertsView {
  PackedLayout w13;                             // gated [2I, H]
  PackedLayout w2;                              // plain [H, I]
  const uint8_t* const* w13_experts = nullptr;  // [num_local_experts]
  const uint8_t* const* w2_experts = nullptr;   // [num_local_experts]
  // The shared experts' MLP as one more expert; null without shared experts.
  PackedLayout shared_w13, shared_w2;
  const uint8_t* const* shared_w13_data = nullptr;  // [1]
  const uint8_t* const* shared_w2_data = nullptr;   // [1]
};

class PackedExperts {
 public:
  PackedExperts() = default;
  // Packs every local expert of `problem` (its w13, w2 and shared weights; batch fields unused).
  static PackedExperts pack(const ExpertsProblem& problem, int num_threads);
  // Packs only the shared experts' weights (for a call that packs the routed ones it touches).
  static PackedExperts pack_shared(const ExpertsProblem& problem, int num_threads);

  PackedExpertsView view() const;
  int64_t nbytes() const;
  // The weights back in their plain layout: w13 [E, 2I, H], w2 [E, H, I], shared_w13 [2 Is, H],
  // shared_w2 [H, Is] (the last two undefined without shared experts).
  Tensor unpack_w13() const;
  Tensor unpack_w2() const;
  Tensor unpack_shared_w13() const;
  Tensor unpack_shared_w2() const;

 private:
  void pack_shared_weights(const ExpertsProblem& problem, int num_threads);

  int64_t num_experts_ = 0;
  PackedLayout w13_layout_, w2_layout_, shared_w13_layout_, shared_w2_layout_;
  Tensor w13_, w2_, shared_w13_, shared_w2_;  // u8 buffers, 64-byte aligned
  std::vector<const uint8_t*> w13_table_, w2_table_, shared_tables_;
};

}  // namespace moe::cpu
