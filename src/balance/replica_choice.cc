// choose_slots: which replica of its expert serves each pair. An expert's pairs split evenly over
// its replicas (the load model of EPLB) and, within that, stay as close to their tokens as the
// split allows: own GPU first, then own node. Each pass walks the pairs in pair order and each
// pair takes the lowest slot that qualifies, so the choice is deterministic.
#include <vector>

#include "balance/trace_layer.h"

namespace moe::balance {
namespace {

enum class Reach : uint8_t { kSameGpu, kSameNode, kAnywhere };

}  // namespace

std::vector<int32_t> choose_slots(const LayerProblem& layer) {
  const int64_t num_experts = layer.num_experts;
  const int64_t num_slots = layer.num_slots();
  const int64_t num_pairs = layer.num_pairs();

  // The slots of each expert in slot order: slots_of[first_slot[e] .. first_slot[e + 1]).
  std::vector<int64_t> first_slot(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t s = 0; s < num_slots; ++s) ++first_slot[static_cast<size_t>(layer.phy2log[s] + 1)];
  for (int64_t e = 0; e < num_experts; ++e) {
    first_slot[static_cast<size_t>(e + 1)] += first_slot[static_cast<size_t>(e)];
  }
  std::vector<int32_t> slots_of(static_cast<size_t>(num_slots));
  {
    std::vector<int64_t> next(first_slot.begin(), first_slot.end() - 1);
    for (int64_t s = 0; s < num_slots; ++s) {
      slots_of[static_cast<size_t>(next[static_cast<size_t>(layer.phy2log[s])]++)] =
          static_cast<int32_t>(s);
    }
  }

  std::vector<int64_t> pairs_of_expert(static_cast<size_t>(num_experts), 0);
  for (int64_t p = 0; p < num_pairs; ++p) ++pairs_of_expert[static_cast<size_t>(layer.topk_ids[p])];
  std::vector<int64_t> room(static_cast<size_t>(num_slots));  // pairs each slot may still take
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t begin = first_slot[static_cast<size_t>(e)];
    const int64_t count = first_slot[static_cast<size_t>(e + 1)] - begin;
    const int64_t pairs = pairs_of_expert[static_cast<size_t>(e)];
    for (int64_t r = 0; r < count; ++r) {
      room[static_cast<size_t>(slots_of[static_cast<size_t>(begin + r)])] =
          pairs / count + (r < pairs % count ? 1 : 0);
    }
  }

  // Pairs of single-slot experts are settled at once; the rest wait for the three passes.
  std::vector<int32_t> slot_of_pair(static_cast<size_t>(num_pairs));
  std::vector<int64_t> waiting;
  for (int64_t p = 0; p < num_pairs; ++p) {
    const int64_t e = layer.topk_ids[p];
    const int64_t begin = first_slot[static_cast<size_t>(e)];
    slot_of_pair[static_cast<size_t>(p)] = slots_of[static_cast<size_t>(begin)];
    if (first_slot[static_cast<size_t>(e + 1)] - begin > 1) waiting.push_back(p);
  }
  if (waiting.empty()) return slot_of_pair;

  for (const Reach reach : {Reach::kSameGpu, Reach::kSameNode, Reach::kAnywhere}) {
    size_t still_waiting = 0;
    for (const int64_t p : waiting) {
      const int64_t e = layer.topk_ids[p];
      const int64_t source = layer.source_gpu[static_cast<size_t>(p / layer.top_k)];
      int32_t chosen = -1;
      for (int64_t i = first_slot[static_cast<size_t>(e)];
           i < first_slot[static_cast<size_t>(e + 1)]; ++i) {
        const int32_t slot = slots_of[static_cast<size_t>(i)];
        if (room[static_cast<size_t>(slot)] == 0) continue;
        const int64_t gpu = layer.gpu_of_slot(slot);
        if (reach == Reach::kSameGpu && gpu != source) continue;
        if (reach == Reach::kSameNode && layer.node_of_gpu(gpu) != layer.node_of_gpu(source)) {
          continue;
        }
        chosen = slot;
        break;
      }
      if (chosen < 0) {
        waiting[still_waiting++] = p;
        continue;
      }
      --room[static_cast<size_t>(chosen)];
      slot_of_pair[static_cast<size_t>(p)] = chosen;
    }
    waiting.resize(still_waiting);
  }
  return slot_of_pair;
}

}  // namespace moe::balance
