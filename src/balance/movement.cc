// plan_expert_movement: the weight transfers that switch a deployment between two placements.
//
// Which experts a GPU must receive depends only on the set of experts it holds before and after,
// never on their order in its slots; the order only decides how many slots get rewritten. So the
// target is first reordered within each GPU: a slot keeps its current expert whenever the GPU
// still needs that expert (as many times as the target asks for it), and the remaining target
// replicas fill the remaining slots in their target order. A slot keeps its replica rank with its
// expert, so log2phy still lists each expert's replicas in the target's rank order.
#include <algorithm>
#include <limits>
#include <vector>

#include "balance/eplb_validation.h"
#include "balance/placement_tables.h"
#include "moe/eplb.h"
#include "moe/error.h"

namespace moe {
namespace {

void check_same_layout(const ExpertPlacement& current, const ExpertPlacement& target) {
  auto check = [](int64_t current_value, int64_t target_value, const char* what) {
    if (current_value != target_value) {
      fail("target: expected the {} of current ({}); got {}", what, current_value, target_value);
    }
  };
  check(current.num_layers, target.num_layers, "num_layers");
  check(current.num_logical_experts, target.num_logical_experts, "num_logical_experts");
  check(current.num_replicas, target.num_replicas, "num_replicas");
  check(current.num_gpus, target.num_gpus, "num_gpus");
  check(current.num_nodes, target.num_nodes, "num_nodes");
}

// Reorders the slots of one GPU of the target (phy2log and replica_rank [slots_per_gpu]) so that
// slots whose current expert stays on the GPU keep it.
void keep_resident_slots(const int32_t* current, int32_t* phy2log, int32_t* replica_rank,
                         int64_t slots_per_gpu, std::vector<int32_t>& expert,
                         std::vector<int32_t>& rank, std::vector<bool>& placed) {
  const size_t n = static_cast<size_t>(slots_per_gpu);
  expert.assign(phy2log, phy2log + n);
  rank.assign(replica_rank, replica_rank + n);
  placed.assign(n, false);
  std::fill(phy2log, phy2log + n, -1);
  for (size_t slot = 0; slot < n; ++slot) {
    for (size_t i = 0; i < n; ++i) {
      if (!placed[i] && expert[i] == current[slot]) {
        phy2log[slot] = expert[i];
        replica_rank[slot] = rank[i];
        placed[i] = true;
        break;
      }
    }
  }
  size_t next = 0;
  for (size_t slot = 0; slot < n; ++slot) {
    if (phy2log[slot] != -1) continue;
    while (placed[next]) ++next;
    phy2log[slot] = expert[next];
    replica_rank[slot] = rank[next];
    placed[next] = true;
  }
}

// The transfers of one layer into `transfers`, destinations and experts ascending.
void plan_layer_transfers(const ExpertPlacement& current, const ExpertPlacement& target,
                          int64_t layer, std::vector<ExpertTransfer>& transfers) {
  const int64_t num_experts = current.num_logical_experts;
  const int64_t slots_per_gpu = current.slots_per_gpu();
  const int64_t gpus_per_node = current.gpus_per_node();
  const int32_t* now = current.phy2log.data() + layer * current.num_replicas;
  const int32_t* next = target.phy2log.data() + layer * target.num_replicas;

  // holders[e]: the GPUs holding expert e now, ascending (slots are numbered GPU by GPU).
  std::vector<std::vector<int32_t>> holders(static_cast<size_t>(num_experts));
  for (int64_t slot = 0; slot < current.num_replicas; ++slot) {
    std::vector<int32_t>& gpus = holders[static_cast<size_t>(now[slot])];
    const int32_t gpu = static_cast<int32_t>(slot / slots_per_gpu);
    if (gpus.empty() || gpus.back() != gpu) gpus.push_back(gpu);
  }
  std::vector<int64_t> sends(static_cast<size_t>(current.num_gpus), 0);
  std::vector<int32_t> held_by(static_cast<size_t>(num_experts), -1);  // last GPU seen holding
  std::vector<int32_t> wanted;

  for (int32_t gpu = 0; gpu < current.num_gpus; ++gpu) {
    const int64_t first = gpu * slots_per_gpu;
    for (int64_t slot = first; slot < first + slots_per_gpu; ++slot) held_by[now[slot]] = gpu;
    wanted.assign(next + first, next + first + slots_per_gpu);
    std::sort(wanted.begin(), wanted.end());
    wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
    for (const int32_t expert : wanted) {
      if (held_by[static_cast<size_t>(expert)] == gpu) continue;
      // Prefer a sender on this node (its fast network), then the least busy, then the lowest.
      int32_t best = -1;
      for (const int32_t holder : holders[static_cast<size_t>(expert)]) {
        if (best < 0) {
          best = holder;
          continue;
        }
        const bool holder_local = holder / gpus_per_node == gpu / gpus_per_node;
        const bool best_local = best / gpus_per_node == gpu / gpus_per_node;
        if (holder_local != best_local) {
          if (holder_local) best = holder;
        } else if (sends[static_cast<size_t>(holder)] < sends[static_cast<size_t>(best)]) {
          best = holder;
        }
      }
      ++sends[static_cast<size_t>(best)];
      transfers.push_back({static_cast<int32_t>(layer), expert, best, gpu});
    }
  }
}

}  // namespace

MovementPlan plan_expert_movement(const ExpertPlacement& current, const ExpertPlacement& target,
                                  int64_t bytes_per_expert) {
  balance::check_placement(current, "current");
  balance::check_placement(target, "target");
  check_same_layout(current, target);
  if (bytes_per_expert < 0) {
    fail("bytes_per_expert: expected the bytes of one expert's weights (>= 0); got {}",
         bytes_per_expert);
  }

  MovementPlan plan;
  plan.placement = target;
  ExpertPlacement& p = plan.placement;
  const int64_t slots_per_gpu = p.slots_per_gpu();
  std::vector<int32_t> expert;
  std::vector<int32_t> rank;
  std::vector<bool> placed;
  for (int64_t first = 0; first < p.num_layers * p.num_replicas; first += slots_per_gpu) {
    keep_resident_slots(current.phy2log.data() + first, p.phy2log.data() + first,
                        p.replica_rank.data() + first, slots_per_gpu, expert, rank, placed);
  }
  balance::fill_log2phy(p);

  for (int64_t layer = 0; layer < p.num_layers; ++layer) {
    plan_layer_transfers(current, p, layer, plan.transfers);
  }
  const int64_t num_transfers = static_cast<int64_t>(plan.transfers.size());
  if (bytes_per_expert > 0 &&
      num_transfers > std::numeric_limits<int64_t>::max() / bytes_per_expert) {
    fail("bytes_per_expert: {} transfers of {} bytes overflow int64", num_transfers,
         bytes_per_expert);
  }
  plan.bytes = num_transfers * bytes_per_expert;
  for (size_t slot = 0; slot < p.phy2log.size(); ++slot) {
    plan.num_slots_rewritten += p.phy2log[slot] != current.phy2log[slot] ? 1 : 0;
  }
  return plan;
}

}  // namespace moe
