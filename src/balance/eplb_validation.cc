// Argument checks of include/moe/eplb.h. They stay on in release builds: a placement read from a
// file or another rank indexes every table below, so a bad id would write out of bounds.
#include "balance/eplb_validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "moe/error.h"

namespace moe::balance {
namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

void check_count(int64_t value, const char* name) {
  if (value < 1 || value > kMaxInt32) fail("{}: expected 1..{}; got {}", name, kMaxInt32, value);
}

void check_table_size(size_t size, int64_t expected, const char* name, const char* shape) {
  if (static_cast<int64_t>(size) != expected) {
    fail("{}: expected {} = {} entries; got {}", name, shape, expected, size);
  }
}

}  // namespace

void check_slot_layout(int64_t num_layers, int64_t num_logical_experts, int64_t num_replicas,
                       int64_t num_gpus, int64_t num_nodes) {
  check_count(num_layers, "num_layers");
  check_count(num_logical_experts, "num_logical_experts");
  check_count(num_replicas, "num_replicas");
  check_count(num_gpus, "num_gpus");
  check_count(num_nodes, "num_nodes");
  if (num_gpus % num_nodes != 0) {
    fail("num_gpus: expected a multiple of num_nodes = {} (the same GPUs on every node); got {}",
         num_nodes, num_gpus);
  }
  if (num_replicas % num_gpus != 0) {
    fail(
        "num_replicas: expected a multiple of num_gpus = {} (the same number of slots on every "
        "GPU); got {}",
        num_gpus, num_replicas);
  }
  if (num_replicas < num_logical_experts) {
    fail(
        "num_replicas: expected at least num_logical_experts = {} (every expert needs a slot); "
        "got {}",
        num_logical_experts, num_replicas);
  }
}

void check_eplb_config(const EplbConfig& config, int64_t num_layers, int64_t num_logical_experts) {
  check_slot_layout(num_layers, num_logical_experts, config.num_replicas, config.num_gpus,
                    config.num_nodes);
  check_count(config.num_groups, "num_groups");
  if (num_logical_experts % config.num_groups != 0) {
    fail(
        "num_groups: expected a divisor of num_logical_experts = {} (groups of equal size); got "
        "{} (pass 1 for a model without expert groups)",
        num_logical_experts, config.num_groups);
  }
}

void check_weight(std::span<const double> weight, int64_t num_layers, int64_t num_logical_experts) {
  check_table_size(weight.size(), num_layers * num_logical_experts, "weight",
                   "[num_layers, num_logical_experts]");
  for (size_t i = 0; i < weight.size(); ++i) {
    if (!std::isfinite(weight[i]) || weight[i] < 0) {
      fail("weight: expected finite loads >= 0; got {} for layer {}, expert {}", weight[i],
           static_cast<int64_t>(i) / num_logical_experts,
           static_cast<int64_t>(i) % num_logical_experts);
    }
  }
}

void check_weight(std::span<const int64_t> weight, int64_t num_layers,
                  int64_t num_logical_experts) {
  check_table_size(weight.size(), num_layers * num_logical_experts, "weight",
                   "[num_layers, num_logical_experts]");
  for (size_t i = 0; i < weight.size(); ++i) {
    if (weight[i] < 0) {
      fail("weight: expected token counts >= 0; got {} for layer {}, expert {}", weight[i],
           static_cast<int64_t>(i) / num_logical_experts,
           static_cast<int64_t>(i) % num_logical_experts);
    }
  }
}

int64_t replicas_per_layer(size_t size, int64_t num_layers, const char* name) {
  check_count(num_layers, "num_layers");
  if (size == 0 || static_cast<int64_t>(size) % num_layers != 0) {
    fail("{}: expected [num_layers = {}, num_replicas] entries, a nonzero multiple of {}; got {}",
         name, num_layers, num_layers, size);
  }
  return static_cast<int64_t>(size) / num_layers;
}

void check_phy2log(std::span<const int32_t> phy2log, int64_t num_layers,
                   int64_t num_logical_experts, int64_t num_replicas, const char* name) {
  check_table_size(phy2log.size(), num_layers * num_replicas, name, "[num_layers, num_replicas]");
  std::vector<int32_t> seen_in_layer(static_cast<size_t>(num_logical_experts), -1);
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const int32_t* row = phy2log.data() + layer * num_replicas;
    for (int64_t slot = 0; slot < num_replicas; ++slot) {
      if (row[slot] < 0 || row[slot] >= num_logical_experts) {
        fail("{}: expected logical expert ids in [0, {}); got {} in layer {}, slot {}", name,
             num_logical_experts, row[slot], layer, slot);
      }
      seen_in_layer[static_cast<size_t>(row[slot])] = static_cast<int32_t>(layer);
    }
    for (int64_t e = 0; e < num_logical_experts; ++e) {
      if (seen_in_layer[static_cast<size_t>(e)] != layer) {
        fail(
            "{}: expected every logical expert in at least one slot; expert {} has none in layer "
            "{}",
            name, e, layer);
      }
    }
  }
}

void check_placement(const ExpertPlacement& p, const char* name) {
  check_slot_layout(p.num_layers, p.num_logical_experts, p.num_replicas, p.num_gpus, p.num_nodes);
  check_phy2log(p.phy2log, p.num_layers, p.num_logical_experts, p.num_replicas, name);
  check_table_size(p.replica_rank.size(), p.num_layers * p.num_replicas, name,
                   "replica_rank [num_layers, num_replicas]");
  check_table_size(p.logcnt.size(), p.num_layers * p.num_logical_experts, name,
                   "logcnt [num_layers, num_logical_experts]");
  if (p.max_replicas < 1 || p.max_replicas > p.num_replicas) {
    fail("{}: expected max_replicas in 1..num_replicas = {}; got {}", name, p.num_replicas,
         p.max_replicas);
  }
  check_table_size(p.log2phy.size(), p.num_layers * p.num_logical_experts * p.max_replicas, name,
                   "log2phy [num_layers, num_logical_experts, max_replicas]");

  const int64_t num_experts = p.num_logical_experts;
  std::vector<int32_t> counted(static_cast<size_t>(num_experts));
  for (int64_t layer = 0; layer < p.num_layers; ++layer) {
    const int32_t* phy2log = p.phy2log.data() + layer * p.num_replicas;
    const int32_t* rank = p.replica_rank.data() + layer * p.num_replicas;
    const int32_t* logcnt = p.logcnt.data() + layer * num_experts;
    const int32_t* log2phy = p.log2phy.data() + layer * num_experts * p.max_replicas;
    std::fill(counted.begin(), counted.end(), 0);
    for (int64_t slot = 0; slot < p.num_replicas; ++slot)
      ++counted[static_cast<size_t>(phy2log[slot])];
    int32_t largest = 0;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (logcnt[e] != counted[static_cast<size_t>(e)]) {
        fail("{}: logcnt of expert {} in layer {} is {}, but phy2log gives it {} slots", name, e,
             layer, logcnt[e], counted[static_cast<size_t>(e)]);
      }
      largest = std::max(largest, logcnt[e]);
    }
    if (largest > p.max_replicas) {
      fail("{}: max_replicas is {}, but expert counts in layer {} reach {}", name, p.max_replicas,
           layer, largest);
    }
    // Each slot's rank must point back at the slot: this makes the ranks of an expert distinct
    // and in 0..count-1, and log2phy their inverse.
    for (int64_t slot = 0; slot < p.num_replicas; ++slot) {
      const int32_t expert = phy2log[slot];
      if (rank[slot] < 0 || rank[slot] >= logcnt[expert] ||
          log2phy[expert * p.max_replicas + rank[slot]] != slot) {
        fail(
            "{}: slot {} of layer {} holds replica {} of expert {}, but log2phy does not list the "
            "slot there (replica ranks must number an expert's slots 0..logcnt-1)",
            name, slot, layer, rank[slot], expert);
      }
    }
    for (int64_t e = 0; e < num_experts; ++e) {
      for (int64_t r = logcnt[e]; r < p.max_replicas; ++r) {
        if (log2phy[e * p.max_replicas + r] != -1) {
          fail("{}: log2phy of expert {} in layer {} has {} past its {} replicas, not -1", name, e,
               layer, log2phy[e * p.max_replicas + r], logcnt[e]);
        }
      }
    }
  }
}

}  // namespace moe::balance
