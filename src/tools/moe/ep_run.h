// `moe run --ep`: the run command as one rank of an MPI job. Each rank holds the experts of its
// slots (synthetic, or cut from a checkpoint's layer), routes its own synthetic tokens, and runs
// the expert-parallel layer; rank 0 prints every rank's traffic and stage times, and checks a
// sample of every rank's tokens against the single-process layer (bit for bit) and the float64
// reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/cpu_isa.h"
#include "tools/moe/ep_options.h"

namespace moe::cli {

struct EpRunOptions {
  std::string preset;
  std::string config_path;
  std::string checkpoint;
  int64_t layer = -1;  // -1: the first MoE layer
  std::string dtype = "bf16";
  std::vector<int64_t> tokens;  // per rank, one batch each
  int threads = 0;
  uint64_t seed = 0;
  int repeats = 5;
  int64_t check_tokens = 8;  // per rank
  int64_t block_m = 0;
  CpuIsa cpu_isa = CpuIsa::kAuto;
  bool json = false;
  EpSettings ep;
};

void run_ep(const EpRunOptions& options);

// `moe run --ep --device cuda`: the same on CudaEpLayer, one GPU per rank (its index among its
// host's ranks); rank 0 checks the sampled tokens against the single-GPU CUDA layer within bf16
// rounding. Throws moe::Error naming an option the GPU path does not take, and in a build without
// moe::cuda_ep (CUDA, MPI and NCCL).
void run_ep_cuda(const EpRunOptions& options);

}  // namespace moe::cli
