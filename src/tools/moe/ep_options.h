// The --ep mode shared by `moe run`, `moe forward` and `moe bench`: its options, the expert map
// they name, and running the command as one rank of an MPI job.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "moe/communicator.h"
#include "moe/cpu_isa.h"
#include "moe/ep_layer.h"
#include "moe/expert_map.h"

namespace moe::cli {

struct EpSettings {
  bool enabled = false;
  std::string dispatcher = "ht";
  std::string placement;  // JSON of `moe eplb --out`; empty = contiguous
  int64_t placement_layer = 0;
  int64_t low_latency_capacity = 0;  // 0 = the batch's tokens per rank (never overflows)
  bool overlap = false;
  bool over_nccl = false;  // --device cuda, ht: rows through NCCL even where GPUs reach each other
  int64_t timeout_ms = 30000;
  int ranks_per_host = 0;
};

// Registers --ep and the options that go with it on `cmd`.
void add_ep_options(CLI::App* cmd, EpSettings& settings);

// The expert map of the settings for a layer of num_experts experts over num_ranks ranks:
// contiguous, or slot by slot from the placement file (its num_gpus must equal num_ranks and its
// num_logical_experts num_experts). Throws moe::Error naming the file and the field.
ExpertMap ep_expert_map(const EpSettings& settings, int64_t num_experts, int num_ranks);

// The low-latency buffers' rows per (source, destination): --ll-capacity, or tokens_per_rank
// (which never overflows) when the settings leave it to the batch.
int64_t low_latency_capacity(const EpSettings& settings, int64_t tokens_per_rank);

// Refuses the settings only GPUs take (--over-nccl), by name.
void check_cpu_ep_settings(const EpSettings& settings);

// EpOptions of the CPU ranks from the settings (checked as check_cpu_ep_settings does).
EpOptions ep_options(const EpSettings& settings, int64_t tokens_per_rank, int num_threads,
                     int64_t block_m);

// What the ranks of a CPU --ep command run with: --threads and --repeats checked (moe::Error
// naming them), the cpu path resolved, and OpenMP set to that many threads (0 = all cores).
struct EpCpuSetup {
  CpuIsa isa = CpuIsa::kAuto;
  int threads = 1;
};
EpCpuSetup setup_ep_cpu(int threads, int repeats, CpuIsa requested);

// Runs body(comm) as this process's rank of an MPI job (under mpirun), then finalizes. A
// moe::Error on a rank is printed as "moe: error: rank R: ..." and ends the whole job with status
// 1 (MPI_Abort): its peers may be stuck in a collective and could never finalize. Throws
// moe::Error when this moe was built without MPI.
void run_as_mpi_rank(const EpSettings& settings, const std::function<void(Communicator&)>& body);

}  // namespace moe::cli
