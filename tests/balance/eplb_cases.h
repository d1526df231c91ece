// Random EPLB problems and the checks every placement must pass, shared by the balance tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moe/eplb.h"

namespace moe::testing {

// One random problem; everything follows from `seed`, so the seed alone reproduces it.
struct EplbCase {
  uint64_t seed = 0;
  int64_t num_layers = 0;
  int64_t num_logical_experts = 0;
  EplbConfig config;
  std::string distribution;
  std::vector<int64_t> counts;  // [num_layers, num_logical_experts]
  std::vector<double> weight;   // the same loads as double

  std::string describe() const;  // sizes, distribution and a command that reruns the seed
};

// Small topologies (1..4 nodes of 1..6 GPUs, 0..3 spare slots per GPU beyond the minimum), both
// policies, and loads that are uniform, Zipf-like, one hot expert, all zero, or few distinct
// values (to exercise ties).
EplbCase random_eplb_case(uint64_t seed);

// Few GPUs per node (2..4) with many slots each (4..8), about two replicas per expert and loads
// of two or three distinct values: bins fill unevenly on ties, the hard case for spreading an
// expert's replicas over distinct GPUs.
EplbCase crowded_eplb_case(uint64_t seed);

// The seeds of the random tests; MOE_EPLB_SEED=<seed> reruns one failing case alone.
std::vector<uint64_t> eplb_case_seeds(uint64_t first, int count);

// Sizes, ids, logcnt (>= 1, summing to num_replicas), replica ranks and log2phy (the inverse of
// phy2log, -1 padded) all consistent.
::testing::AssertionResult is_consistent_placement(const ExpertPlacement& p, int64_t num_layers,
                                                   int64_t num_logical_experts,
                                                   int64_t num_replicas, int64_t num_gpus);

// The placement's slots per layer as one multiset per GPU: [layer][gpu] sorted expert ids.
std::vector<std::vector<std::vector<int32_t>>> experts_per_gpu(const ExpertPlacement& p);

}  // namespace moe::testing
