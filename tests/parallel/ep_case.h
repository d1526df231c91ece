// One expert-parallel run checked against the single-process layer: the harness of the EP tests.
// A case is a config, an expert map and per-rank token counts for one or more steps; every rank
// runs EpMoeLayer on a thread of an in-process group, and each rank's output is compared bit for
// bit with its rows of MoeLayer's output on the whole batch.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "moe/config.h"
#include "moe/ep_layer.h"
#include "moe/expert_map.h"
#include "moe/layer.h"

namespace moe::testing {

// A small layer of each routing family: qwen3, qwen2 (gated shared expert), deepseek (sigmoid,
// groups, correction bias, scaling, shared expert), llama4 (weight on input), gpt-oss (router
// bias, expert biases, clamped SwiGLU).
MoeConfig small_ep_config(const std::string& family, int64_t num_experts = 12);

struct EpCase {
  std::string family = "qwen3";
  int64_t num_experts = 12;
  int64_t hidden_size = 40;  // small_ep_config's
  DType dtype = DType::kF32;
  int num_ranks = 2;
  std::vector<std::vector<int64_t>> steps = {{5, 3}};  // [step][rank]: tokens
  EpOptions options;
  std::optional<ExpertMap> map;  // default: contiguous
  int ranks_per_host = 0;
  uint64_t seed = 1;
  // Changes the full weights before the layers are built (e.g. to steer the routing).
  std::function<void(LayerWeights&)> edit_weights;

  std::string describe() const;
};

// What a case needs on every rank: the layer, the whole batch of each step and the single-process
// output on it.
struct EpCaseData {
  MoeConfig config;
  LayerWeights full;
  std::optional<ExpertMap> map;
  std::vector<Tensor> hidden, expected;         // [step]: [total tokens, H]
  std::vector<std::vector<int64_t>> first_row;  // [step][rank]
};
EpCaseData prepare_ep_case(const EpCase& c);

// What one rank saw.
struct EpRankResult {
  std::vector<EpStepStats> stats;  // [step]
  int64_t mismatches = 0;          // elements that differ from the single-process output
  std::string first_mismatch;
};

// Runs every step of the case on this rank (a collective over comm). Throws what the layer
// throws.
void run_ep_rank(const EpCase& c, const EpCaseData& data, Communicator& comm, EpRankResult& result);

struct EpRun {
  std::vector<std::string> errors;              // [rank]: empty when the rank succeeded
  std::vector<std::vector<EpStepStats>> stats;  // [step][rank]
  int64_t mismatches = 0;
};

// Runs the case on threads; adds a test failure for each rank whose output differs (naming the
// first element), unless expect_errors (then only the errors are returned).
EpRun run_ep_case(const EpCase& c, bool expect_errors = false);

}  // namespace moe::testing
