// ExpertMap: which rank of an expert-parallel group holds which physical expert slot.
//
// A slot holds the weights of one logical expert; an expert may have several slots (EPLB's
// redundant experts), on one rank or on several. Each rank numbers its own slots 0.. in ascending
// global slot order: that is the order of the rows of its local w13 / w2. Which replica serves a
// pair is the dispatcher's choice (moe/ep_layer.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace moe {

class ExpertMap {
 public:
  // E experts over N ranks, one slot each, in order: rank r holds a contiguous range, the first
  // E mod N ranks one expert more than the others. Throws moe::Error unless 1 <= N <= E.
  static ExpertMap contiguous(int64_t num_experts, int num_ranks);

  // EPLB's layout (moe/eplb.h, `moe eplb --out`): slot s holds expert phy2log[s] and lives on
  // rank s / (S / N), S = phy2log.size(). Throws moe::Error unless N divides S and every expert
  // in [0, num_experts) has a slot.
  static ExpertMap from_phy2log(std::span<const int32_t> phy2log, int64_t num_experts,
                                int num_ranks);

  // The general form: slot s holds expert slot_experts[s] on rank slot_ranks[s]. Throws
  // moe::Error naming the slot unless ids are in range, every expert has a slot and every rank
  // holds at least one slot.
  ExpertMap(std::vector<int32_t> slot_experts, std::vector<int32_t> slot_ranks, int64_t num_experts,
            int num_ranks);

  int64_t num_experts() const { return num_experts_; }
  int64_t num_slots() const { return static_cast<int64_t>(slot_experts_.size()); }
  int num_ranks() const { return num_ranks_; }

  int32_t expert_of_slot(int64_t slot) const { return slot_experts_[static_cast<size_t>(slot)]; }
  int32_t rank_of_slot(int64_t slot) const { return slot_ranks_[static_cast<size_t>(slot)]; }
  // The slot's index among its rank's slots: its row in that rank's w13 / w2.
  int32_t local_index(int64_t slot) const { return local_index_[static_cast<size_t>(slot)]; }
  // The global slots of `rank`, ascending.
  std::span<const int32_t> local_slots(int rank) const;
  // The logical expert of each local slot of `rank`: which experts' weights the rank loads.
  std::vector<int32_t> local_experts(int rank) const;
  // The slots holding `expert`, ascending.
  std::span<const int32_t> replicas(int64_t expert) const;
  bool has_replicas() const { return num_slots() > num_experts_; }

  // The experts kernels' expert_map for `rank` over global slot ids: [num_slots] int32, the local
  // index of the rank's slots, -1 elsewhere (those blocks are skipped).
  std::vector<int32_t> kernel_expert_map(int rank) const;

 private:
  int64_t num_experts_ = 0;
  int num_ranks_ = 0;
  std::vector<int32_t> slot_experts_;    // [S]
  std::vector<int32_t> slot_ranks_;      // [S]
  std::vector<int32_t> local_index_;     // [S]
  std::vector<int32_t> rank_offsets_;    // [N + 1] into rank_slots_
  std::vector<int32_t> rank_slots_;      // [S]: slots grouped by rank, ascending
  std::vector<int32_t> expert_offsets_;  // [E + 1] into expert_slots_
  std::vector<int32_t> expert_slots_;    // [S]: slots grouped by expert, ascending
};

}  // namespace moe
