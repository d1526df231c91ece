#include "tools/moe/ep_options.h"

#include <omp.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "moe/error.h"

namespace moe::cli {

void add_ep_options(CLI::App* cmd, EpSettings& s) {
  CLI::Option* ep = cmd->add_flag(
      "--ep", s.enabled,
      "Expert parallelism: run as one rank of an MPI job (start with mpirun -np N); each rank "
      "holds its experts' weights and its own tokens");
  cmd->add_option("--dispatcher", s.dispatcher,
                  "ht (high-throughput: count exchange, exact sizes) or ll (low-latency: "
                  "fixed buffers, no count exchange)")
      ->check(CLI::IsMember({"ht", "ll"}))
      ->capture_default_str()
      ->needs(ep);
  cmd->add_option("--placement", s.placement,
                  "Expert placement JSON written by `moe eplb --out` (default: contiguous)")
      ->needs(ep);
  cmd->add_option("--placement-layer", s.placement_layer, "Layer of the placement file to use")
      ->capture_default_str()
      ->needs(ep);
  cmd->add_option("--ll-capacity", s.low_latency_capacity,
                  "Low-latency: token rows one rank may send another (0 = tokens per rank)")
      ->capture_default_str()
      ->needs(ep);
  cmd->add_flag("--overlap", s.overlap,
                "Two-batch overlap: split each batch in two so one half's dispatch and combine "
                "run while the other half's experts compute")
      ->needs(ep);
  cmd->add_flag("--over-nccl", s.over_nccl,
                "--device cuda with --dispatcher ht: move the rows through NCCL even where the "
                "GPUs reach each other peer to peer (the path across hosts)")
      ->needs(ep);
  cmd->add_option("--timeout-ms", s.timeout_ms,
                  "Fail a step whose peers have not answered after this long")
      ->capture_default_str()
      ->needs(ep);
  cmd->add_option("--ranks-per-host", s.ranks_per_host,
                  "Pretend hosts of this many ranks, for the cross-host counters on one machine "
                  "(0 = the real hosts)")
      ->capture_default_str()
      ->needs(ep);
}

ExpertMap ep_expert_map(const EpSettings& s, int64_t num_experts, int num_ranks) {
  if (s.placement.empty()) return ExpertMap::contiguous(num_experts, num_ranks);
  std::ifstream file(s.placement);
  if (!file) fail("--placement: cannot open '{}'", s.placement);
  nlohmann::json json;
  try {
    file >> json;
  } catch (const nlohmann::json::exception& e) {
    fail("--placement: '{}' is not valid JSON: {}", s.placement, e.what());
  }
  const auto integer = [&](const char* field) {
    if (!json.is_object() || !json.contains(field) || !json[field].is_number_integer()) {
      fail("--placement: '{}': expected an integer \"{}\" (a file of `moe eplb --out`)",
           s.placement, field);
    }
    return json[field].get<int64_t>();
  };
  const int64_t layers = integer("num_layers"), gpus = integer("num_gpus");
  const int64_t experts = integer("num_logical_experts");
  if (gpus != num_ranks) {
    fail("--placement: '{}' places experts on {} GPUs; this job has {} ranks", s.placement, gpus,
         num_ranks);
  }
  if (experts != num_experts) {
    fail("--placement: '{}' places {} experts; the model has {}", s.placement, experts,
         num_experts);
  }
  if (s.placement_layer < 0 || s.placement_layer >= layers) {
    fail("--placement-layer: expected a layer in [0, {}) of '{}'; got {}", layers, s.placement,
         s.placement_layer);
  }
  const nlohmann::json& rows = json["phy2log"];
  if (!rows.is_array() || static_cast<int64_t>(rows.size()) != layers ||
      !rows[s.placement_layer].is_array()) {
    fail("--placement: '{}': expected \"phy2log\" with one list of slots per layer", s.placement);
  }
  std::vector<int32_t> phy2log;
  for (const nlohmann::json& slot : rows[s.placement_layer]) {
    // Checked as read, before narrowing: 2^32 would otherwise pass as expert 0.
    const int64_t expert = slot.is_number_integer() ? slot.get<int64_t>() : -1;
    if (expert < 0 || expert >= num_experts) {
      fail("--placement: '{}': phy2log entries must be expert ids in [0, {}); got {} at slot {}",
           s.placement, num_experts, slot.dump(), phy2log.size());
    }
    phy2log.push_back(static_cast<int32_t>(expert));
  }
  return ExpertMap::from_phy2log(phy2log, num_experts, num_ranks);
}

int64_t low_latency_capacity(const EpSettings& s, int64_t tokens_per_rank) {
  if (s.low_latency_capacity < 0) {
    fail("--ll-capacity: expected 0 (tokens per rank) or a count of rows; got {}",
         s.low_latency_capacity);
  }
  return s.low_latency_capacity > 0 ? s.low_latency_capacity
                                    : std::max<int64_t>(tokens_per_rank, 1);
}

void check_cpu_ep_settings(const EpSettings& s) {
  if (s.over_nccl) {
    fail("--over-nccl: the CPU ranks move rows through MPI; the flag belongs to --device cuda");
  }
}

EpOptions ep_options(const EpSettings& s, int64_t tokens_per_rank, int num_threads,
                     int64_t block_m) {
  check_cpu_ep_settings(s);
  EpOptions o;
  o.dispatcher = parse_dispatcher(s.dispatcher);
  o.two_batch_overlap = s.overlap;
  o.low_latency_capacity = low_latency_capacity(s, tokens_per_rank);
  o.num_threads = num_threads;
  o.block_m = block_m;
  return o;
}

EpCpuSetup setup_ep_cpu(int threads, int repeats, CpuIsa requested) {
  if (threads < 0) fail("--threads: expected >= 0 (0 = all cores); got {}", threads);
  if (repeats < 1) fail("--repeats: expected >= 1; got {}", repeats);
  EpCpuSetup setup;
  setup.isa = resolve_cpu_isa(requested);
  setup.threads = threads > 0 ? threads : omp_get_max_threads();
  omp_set_num_threads(setup.threads);
  return setup;
}

}  // namespace moe::cli
