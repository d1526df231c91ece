// The steps `moe bench --ep` replays, on the CPU ranks and on GPUs alike: one layer of a routing
// trace, a file of `moe trace` or a synthetic trace made in place per token count
// (synthesize_trace, Zipf-skewed). Each trace step is one EP step; token t of a step (counted from
// the step's first token) lives on rank t % N. A trace's source_gpu is not used: a trace recorded
// on another number of GPUs would name ranks this job lacks. The router weights are uniform, 1/k
// per pair: they change no count or time, only the values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/config.h"
#include "tools/moe/ep_bench.h"

namespace moe::cli {

// One rank's part of one EP step.
struct RankStep {
  int64_t tokens = 0;
  std::vector<int32_t> ids;    // [tokens, k]
  std::vector<float> weights;  // [tokens, k]: 1/k each
};

// A trace layer as EP steps, this rank's share of each.
struct Workload {
  int64_t tokens_per_rank = -1;  // -1: a trace file's steps
  int64_t num_tokens = 0;        // every rank's, over all steps
  int64_t max_rank_tokens = 0;   // the most tokens any rank holds in one step
  std::vector<RankStep> steps;
};

// This rank's share of the trace file's layer (--trace, --trace-layer), or of one synthetic trace
// per --tokens (--steps, --zipf, --seed). Throws moe::Error naming the option or file at fault: a
// trace over other experts or another top-k, a layer it lacks or without steps, values out of
// range.
std::vector<Workload> ep_bench_workloads(const EpBenchOptions& options, const MoeConfig& config,
                                         int rank, int num_ranks);

// The routing as the report's header line and JSON name it.
std::string ep_bench_routing_line(const EpBenchOptions& options, int num_ranks);
nlohmann::json ep_bench_routing_json(const EpBenchOptions& options);

}  // namespace moe::cli
