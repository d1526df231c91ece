// `moe bench --device cuda`: the experts of one MoE layer on the GPU, timed as CUDA-graph
// replays over rotating routings, next to the floor measured in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/fused_experts.h"
#include "moe/config.h"

namespace moe::cli {

struct CudaBenchOptions {
  std::vector<int64_t> tokens;
  int repeats = 20;      // timed replays of each of the routing sets
  int routing_sets = 8;  // distinct routings rotated so decode weights do not sit in L2
  bool sweep = false;    // also time every plan that can run the shape
  // also time these (plan names: "tma/128") at every size where they can run
  std::vector<std::string> plans;
  uint64_t seed = 0;
  bool balanced = false;  // balanced routings (experts_sweep.h) instead of uniform random ones
  bool timeline = false;  // record the last replay's thread blocks (tma plans): CudaBenchRow
  // > 0: after each size's round of every plan, the plans within this share of its best median
  // (plan_finalists) are timed again, alone in turns (CudaBenchRow::final_us).
  double finalist_margin = 0;
  // Not empty: after each size, a line on stderr that starts with this ("moe tune"), so that a
  // sweep of several minutes shows where it is.
  std::string progress_label;
};

// When the thread blocks of the tma plans' GEMMs started and ended in one replay, in microseconds
// from gemm1's first start: min, median and max over each GEMM's thread blocks.
struct TimelineSummary {
  int gemm1_blocks = 0, gemm2_blocks = 0;  // 0: the plan recorded none
  double gemm1_end[3] = {}, gemm2_start[3] = {}, gemm2_end[3] = {};
  cuda::ExpertsRunner::StageMarks marks = {};
  double replay_us = 0;  // that replay's time between its events
};

// The two ceilings of the floor, measured on the current GPU.
struct CudaCeilings {
  double copy_bytes_per_s = 0;  // device-to-device copy, bytes read plus written
  double bf16_flops_per_s = 0;  // cuBLAS bf16 GEMM 8192^3, f32 accumulation
  std::string device_name;
};

struct CudaBenchRow {
  int64_t tokens = 0;
  std::string plan;         // cuda_plans::plan_name: "stream/16", "mma/128", "tiny/1"
  bool is_default = false;  // cuda::default_plan, the choice when no tuned table has the shape
  // cuda_plans::choose_plan: the plan a call of this size runs here (the tuned table's entry when
  // one can run it, else the default).
  bool is_chosen = false;
  std::string cannot_run;  // why the plan cannot run this size (cuda::why_plan_cannot_run): untimed
  double median_us = 0, min_us = 0;
  // Median of the final round (CudaBenchOptions::finalist_margin); 0: the plan was not in one.
  double final_us = 0;
  double align_us = 0, gemm1_us = 0, gemm2_us = 0, sum_us = 0;  // one un-captured call
  double distinct_experts = 0;                                  // mean over the routing sets
  double weight_bytes = 0, flops = 0;
  double floor_us = 0;
  size_t workspace_bytes = 0;
  TimelineSummary timeline;  // CudaBenchOptions::timeline: the last timed replay's
};

CudaCeilings measure_cuda_ceilings();

// `moe bench --device cuda`: measures the ceilings, runs the sweep, prints the table (or JSON)
// and writes the JSON report to `output` when given.
struct CudaBenchCommand {
  std::string preset;
  std::vector<int64_t> tokens;
  int repeats = 20;
  bool sweep = false;
  std::vector<std::string> plans;
  bool json = false;
  std::string output;
  uint64_t seed = 0;
  bool balanced = false;
  bool timeline = false;
  bool final_round = false;  // CudaBenchOptions::finalist_margin = kFinalistMargin
};
void run_cuda_bench_command(const CudaBenchCommand& options);

std::vector<CudaBenchRow> run_cuda_bench(const MoeConfig& config, const CudaBenchOptions& options,
                                         const CudaCeilings& ceilings);

}  // namespace moe::cli
