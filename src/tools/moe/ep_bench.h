// `moe bench --ep`: one MoE layer end to end with expert parallelism (mpirun -np N), on CPU
// ranks (EpMoeLayer) or one GPU per rank (CudaEpLayer, --device cuda), driven by a routing trace
// instead of the router, so that a skewed load can be replayed on the contiguous expert map and
// on an EPLB placement alike:
//   routing  a trace file's layer (`moe trace`), or a synthetic trace made in place per token
//            count (ep_workload.h).
//   timing   a warm-up pass over the steps, then --repeats passes; each step runs the layer's
//            forward_routed on every rank (GPU: its stage times are CUDA events).
//   report   per token count: the median over timed steps of the slowest rank's step time; each
//            rank's load (pairs its experts served in one pass) and max/mean load; bytes per
//            pass by peer and domain next to the T*k*H*b bound; stage times per pass (median
//            over the passes) (ep_bench_report.h).
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

// The same on CudaEpLayer, one GPU per rank (its index among its host's ranks), bf16, the weights
// drawn on the GPU; the GPU counts the pairs each slot serves in the warm-up pass, which gives
// the counters. Throws moe::Error, before any MPI or GPU work, on the options the GPU layer does
// not take (another dtype, a CPU path or threads, --ranks-per-host), and in a build without
// moe::cuda_ep (CUDA, MPI and NCCL).
void bench_ep_cuda(const EpBenchOptions& options);

}  // namespace moe::cli
