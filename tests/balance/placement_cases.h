// Synthetic routing traces and random placement problems, shared by the placement tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/placement.h"

namespace moe::testing {

// Tokens that prefer the experts "homed" on their own node. Sources are round robin, so token t
// lives on node (t % num_gpus) / gpus_per_node.
struct TraceShape {
  int64_t num_layers = 1;
  int64_t num_experts = 0;
  int64_t top_k = 1;
  int64_t tokens_per_layer = 0;
  double affinity = 0;        // chance that a pick comes from the token's node's home experts
  double zipf = 0;            // popularity exponent over a random rank per layer (0: uniform)
  bool shuffle_homes = true;  // homes a random partition per layer, else contiguous blocks
};

// Node n's home experts are the n-th of num_nodes equal blocks (of a random permutation of the
// experts when shuffle_homes). Each pick: the home block with probability `affinity`, else all
// experts; within it, by popularity; a repeat of the token's earlier pick is drawn again.
RoutingTrace synthetic_trace(const TraceShape& shape, const Topology& topology, uint64_t seed);

// The home node of each expert in layer `layer` of synthetic_trace(shape, topology, seed).
std::vector<int64_t> home_nodes(const TraceShape& shape, const Topology& topology, uint64_t seed,
                                int64_t layer);

// One random problem; everything follows from `seed`.
struct PlacementCase {
  uint64_t seed = 0;
  Topology topology;
  RoutingTrace trace;
  ExpertPlacement start;
  std::string start_kind;  // contiguous | eplb | shuffled
  double load_bound = 1;

  std::string describe() const;  // sizes and a command that reruns the seed
};

// 1..3 nodes of 1..4 GPUs, 1..3 layers, 1..4 experts per GPU with 0..2 spare slots per GPU,
// top_k 1..6, 0..300 tokens, any affinity and skew; the start contiguous, from EPLB or a random
// shuffle; load_bound from 1 (as tight as it gets) to 2.
PlacementCase random_placement_case(uint64_t seed);

// The seeds of the random tests; MOE_PLACEMENT_SEED=<seed> reruns one failing case alone.
std::vector<uint64_t> placement_case_seeds(uint64_t first, int count);

}  // namespace moe::testing
