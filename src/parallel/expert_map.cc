#include "moe/expert_map.h"

#include "moe/error.h"

namespace moe {

namespace {

// Groups the indices 0..keys.size()-1 by key (stable: ascending inside a group).
void group_by(const std::vector<int32_t>& keys, int64_t num_keys, std::vector<int32_t>& offsets,
              std::vector<int32_t>& grouped) {
  offsets.assign(static_cast<size_t>(num_keys + 1), 0);
  for (int32_t key : keys) ++offsets[static_cast<size_t>(key) + 1];
  for (int64_t k = 0; k < num_keys; ++k) offsets[k + 1] += offsets[k];
  grouped.resize(keys.size());
  std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
  for (size_t i = 0; i < keys.size(); ++i) grouped[next[keys[i]]++] = static_cast<int32_t>(i);
}

}  // namespace

ExpertMap ExpertMap::contiguous(int64_t num_experts, int num_ranks) {
  if (num_ranks < 1 || num_experts < num_ranks) {
    fail(
        "ExpertMap::contiguous: expected 1 <= ranks <= experts (every rank holds an expert); got "
        "{} experts over {} ranks",
        num_experts, num_ranks);
  }
  std::vector<int32_t> experts(static_cast<size_t>(num_experts)), ranks(experts.size());
  const int64_t base = num_experts / num_ranks, extra = num_experts % num_ranks;
  int64_t e = 0;
  for (int r = 0; r < num_ranks; ++r) {
    const int64_t count = base + (r < extra ? 1 : 0);
    for (int64_t i = 0; i < count; ++i, ++e) {
      experts[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      ranks[static_cast<size_t>(e)] = r;
    }
  }
  return ExpertMap(std::move(experts), std::move(ranks), num_experts, num_ranks);
}

ExpertMap ExpertMap::from_phy2log(std::span<const int32_t> phy2log, int64_t num_experts,
                                  int num_ranks) {
  const int64_t num_slots = static_cast<int64_t>(phy2log.size());
  if (num_ranks < 1 || num_slots % num_ranks != 0) {
    fail(
        "ExpertMap::from_phy2log: expected the {} slots to split evenly over the ranks; got {} "
        "ranks (a placement for another GPU count?)",
        num_slots, num_ranks);
  }
  const int64_t per_rank = num_slots / num_ranks;
  std::vector<int32_t> ranks(static_cast<size_t>(num_slots));
  for (int64_t s = 0; s < num_slots; ++s)
    ranks[static_cast<size_t>(s)] = static_cast<int32_t>(s / per_rank);
  return ExpertMap(std::vector<int32_t>(phy2log.begin(), phy2log.end()), std::move(ranks),
                   num_experts, num_ranks);
}

ExpertMap::ExpertMap(std::vector<int32_t> slot_experts, std::vector<int32_t> slot_ranks,
                     int64_t num_experts, int num_ranks)
    : num_experts_(num_experts),
      num_ranks_(num_ranks),
      slot_experts_(std::move(slot_experts)),
      slot_ranks_(std::move(slot_ranks)) {
  if (num_experts_ < 1 || num_ranks_ < 1) {
    fail("ExpertMap: expected >= 1 expert and >= 1 rank; got {} and {}", num_experts_, num_ranks_);
  }
  if (slot_ranks_.size() != slot_experts_.size()) {
    fail("ExpertMap: expected a rank for each of the {} slots; got {}", slot_experts_.size(),
         slot_ranks_.size());
  }
  for (size_t s = 0; s < slot_experts_.size(); ++s) {
    if (slot_experts_[s] < 0 || slot_experts_[s] >= num_experts_) {
      fail("ExpertMap: slot {}: expected an expert id in [0, {}); got {}", s, num_experts_,
           slot_experts_[s]);
    }
    if (slot_ranks_[s] < 0 || slot_ranks_[s] >= num_ranks_) {
      fail("ExpertMap: slot {}: expected a rank in [0, {}); got {}", s, num_ranks_, slot_ranks_[s]);
    }
  }
  group_by(slot_ranks_, num_ranks_, rank_offsets_, rank_slots_);
  group_by(slot_experts_, num_experts_, expert_offsets_, expert_slots_);
  for (int64_t e = 0; e < num_experts_; ++e) {
    if (expert_offsets_[e] == expert_offsets_[e + 1]) {
      fail("ExpertMap: expected every expert in at least one slot; expert {} has none", e);
    }
  }
  local_index_.assign(slot_experts_.size(), -1);
  for (int r = 0; r < num_ranks_; ++r) {
    if (rank_offsets_[r] == rank_offsets_[r + 1]) {
      fail("ExpertMap: expected every rank to hold at least one slot; rank {} holds none", r);
    }
    for (int32_t i = rank_offsets_[r]; i < rank_offsets_[r + 1]; ++i) {
      local_index_[static_cast<size_t>(rank_slots_[i])] = i - rank_offsets_[r];
    }
  }
}

std::span<const int32_t> ExpertMap::local_slots(int rank) const {
  if (rank < 0 || rank >= num_ranks_) {
    fail("ExpertMap: expected a rank in [0, {}); got {}", num_ranks_, rank);
  }
  return std::span<const int32_t>(rank_slots_)
      .subspan(rank_offsets_[rank], rank_offsets_[rank + 1] - rank_offsets_[rank]);
}

std::vector<int32_t> ExpertMap::local_experts(int rank) const {
  std::vector<int32_t> experts;
  for (int32_t slot : local_slots(rank)) experts.push_back(expert_of_slot(slot));
  return experts;
}

std::span<const int32_t> ExpertMap::replicas(int64_t expert) const {
  if (expert < 0 || expert >= num_experts_) {
    fail("ExpertMap: expected an expert in [0, {}); got {}", num_experts_, expert);
  }
  return std::span<const int32_t>(expert_slots_)
      .subspan(expert_offsets_[expert], expert_offsets_[expert + 1] - expert_offsets_[expert]);
}

std::vector<int32_t> ExpertMap::kernel_expert_map(int rank) const {
  std::vector<int32_t> map(slot_experts_.size(), -1);
  for (int32_t slot : local_slots(rank)) map[static_cast<size_t>(slot)] = local_index(slot);
  return map;
}

}  // namespace moe
