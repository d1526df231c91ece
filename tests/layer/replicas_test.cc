// Experts served from replicated slots: the replica assignment spreads each expert's pairs
// evenly, and the layer's outputs do not depend on how the slots are laid out.
#include <algorithm>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/random_tensors.h"
#include "kernels/cpu/assign_replicas.h"
#include "moe/config.h"
#include "moe/error.h"
#include "moe/layer.h"

namespace moe {
namespace {

TEST(Replicas, AssignmentSpreadsEachExpertEvenlyInPairOrder) {
  // Expert 0 has slots {2, 0}, expert 1 has slot {1}, expert 2 has slots {3, 4, 5}.
  const int32_t expert_slots[] = {2, 0, -1, 1, -1, -1, 3, 4, 5};
  const int32_t replica_count[] = {2, 1, 3};
  const int32_t topk_ids[] = {0, 2, 0, 2, 1, 2, 0, 2};
  int32_t slots[8];
  int32_t scratch[3];
  cpu::assign_replicas(topk_ids, 8, 3, expert_slots, 3, replica_count, slots, scratch);
  const int32_t expected[] = {2, 3, 0, 4, 1, 5, 2, 3};
  EXPECT_TRUE(std::equal(slots, slots + 8, expected));
}

MoeConfig small_qwen3() {
  MoeConfig c = preset_config("qwen3-30b-a3b");
  c.experts.hidden_size = 48;
  c.experts.intermediate_size = 20;
  c.routing.num_experts = 10;
  c.routing.top_k = 3;
  return c;
}

TEST(Replicas, OutputsAreBitwiseTheSameWhateverTheSlots) {
  const MoeConfig config = small_qwen3();
  const LayerWeights weights = synthetic_layer_weights(config, DType::kBF16, 9);
  for (Backend backend : {Backend::kCpu, Backend::kReference}) {
    MoeLayer plain(config, weights, LayerOptions{backend, 2, 0});
    MoeLayer replicated(config, weights, LayerOptions{backend, 2, 0});
    // 16 slots: experts 3 and 7 three times each, expert 0 twice, in a scrambled order.
    replicated.set_replicas({7, 3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 0, 7, 9});
    EXPECT_EQ(replicated.num_slots(), 16);
    for (int64_t tokens : {1, 7, 40}) {
      const Tensor hidden = testing::random_normal(DType::kBF16, {tokens, 48}, 50 + tokens);
      const Tensor a = plain.forward(hidden);
      const Tensor b = replicated.forward(hidden);
      EXPECT_EQ(std::memcmp(a.data<void>(), b.data<void>(), a.nbytes()), 0)
          << backend_name(backend) << " M=" << tokens;
      // Slot counts add up to the pairs, and each expert's count splits over its slots.
      const TensorView slots = replicated.last_slot_counts();
      const TensorView experts = replicated.last_expert_counts();
      ASSERT_EQ(slots.numel(), 16);
      int64_t expert3 = 0;
      for (int64_t slot : {1, 5, 12}) expert3 += slots.as<int32_t>()[slot];
      EXPECT_EQ(expert3, experts.as<int32_t>()[3]);
      for (int64_t slot : {1, 5, 12}) {
        EXPECT_LE(std::abs(slots.as<int32_t>()[slot] * 3 - expert3), 3) << "slot " << slot;
      }
    }
  }
}

TEST(Replicas, RejectsSlotListsThatLoseAnExpert) {
  const MoeConfig config = small_qwen3();
  MoeLayer layer(config, synthetic_layer_weights(config, DType::kF32, 1));
  EXPECT_THROW(layer.set_replicas({0, 1, 2, 3, 4, 5, 6, 7, 8}), Error);  // expert 9 missing
  EXPECT_THROW(layer.set_replicas({0, 1, 2, 3, 4, 5, 6, 7, 8, 10}), Error);
  layer.set_replicas({});  // back to one slot per expert
  EXPECT_EQ(layer.num_slots(), 10);
}

}  // namespace
}  // namespace moe
