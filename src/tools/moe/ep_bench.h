// `moe bench --ep`: one MoE layer end to end with expert parallelism on CPU ranks (mpirun -np N),
// driven by a routing trace instead of the router, so that a skewed load can be replayed on the
// contiguous expert map and on an EPLB placement alike:
//   routing  a trace file's layer (`moe trace`), or a synthetic trace made in place per token
//            count (synthesize_trace, Zipf-skewed). Each trace step is one EP step; token t of
//            a step (counted from the step's first token) lives on rank t % N. The router
//            weights are uniform, 1/k per pair: they change no count or time, only the values.
//   timing   a warm-up pass over the steps, then --repeats passes; each step runs
//            EpMoeLayer::forward_routed on every rank.
//   report   per token count: the median over timed steps of the slowest rank's step time; each
//            rank's load (pairs its experts served in one pass) and max/mean load; bytes per
//            pass by peer and domain next to the T*k*H*b bound; stage times per pass (median
//            over the passes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/cpu_isa.h"
#include "tools/moe/ep_options.h"

namespace moe::cli {

struct EpBenchOptions {
  std::string preset;
  std::string config_path;
  std::string dtype = "bf16";
  std::vector<int64_t> tokens;  // per rank and step: one synthetic trace each (not with a file)
  int threads = 0;
  uint64_t seed = 0;  // weights, hidden states and the synthetic trace
  int repeats = 5;
  int64_t block_m = 0;
  CpuIsa cpu_isa = CpuIsa::kAuto;
  bool json = false;
  std::string trace_path;  // empty: synthetic
  int64_t trace_layer = 0;
  double zipf = 1.0;
  int64_t steps = 4;  // synthetic trace steps
  EpSettings ep;
};

// Runs the benchmark as this process's rank of an MPI job; rank 0 prints the report. Throws
// moe::Error naming the option or file at fault.
void bench_ep(const EpBenchOptions& options);

}  // namespace moe::cli
