// What `moe bench --ep` reports for one token count (or a trace file's steps), on CPU ranks and
// GPUs alike: the slowest rank's step time, each rank's load and max/mean load (by rank and by
// slot), bytes sent and received by domain next to the T*k*H*b bound, and median stage times; as
// a table or JSON. What a layer does not measure (kNotMeasured) shows as "-" and null.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/moe/ep_report.h"

namespace moe::cli {

struct EpBenchGroup {
  int64_t tokens_per_rank = -1;  // per step; -1: the steps of a trace file
  int64_t num_steps = 0;
  int64_t num_tokens = 0;  // over all ranks and steps of one pass
  int passes = 0;          // timed passes over the steps
  // Per rank, over one pass of the steps: counters (pairs_received is the rank's load) and stage
  // times (the median over the timed passes).
  std::vector<EpRankSummary> ranks;
  std::vector<double> slowest_step_us;  // [passes * steps]: the slowest rank's time of each step

  double median_step_us() const;
  double mean_load() const;
  double max_load() const;
  double max_over_mean_load() const;  // 0 when no pair was served
  // The same over every slot of every rank: the busiest slot against the mean slot.
  double mean_slot_load() const;
  double max_slot_load() const;
  double max_over_mean_slot_load() const;
};

void print_ep_bench_group(const EpBenchGroup& group);
nlohmann::json ep_bench_group_json(const EpBenchGroup& group);

}  // namespace moe::cli
