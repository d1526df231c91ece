// The CPU experts of one Qwen3-30B-A3B layer (bf16 weights), per instruction-set path this
// machine supports, at decode and prefill batch sizes. Each iteration is one call of the layer's
// experts on a new uniform random top-8 routing, on the next of three weight copies (so weights
// come from memory). Counters: the floor from this process's measured streaming-read bandwidth
// and the path's measured peak (the same measurements as `moe bench`), and the fraction of it
// reached. `moe bench` sweeps more sizes, dtypes and paths in one table.
//
// Run: build/release/bench/moe_bench_experts [--benchmark_filter=avx2]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "moe/config.h"
#include "moe/cpu_isa.h"
#include "moe/layer.h"
#include "tools/moe/experts_sweep.h"

namespace {

constexpr int kCopies = 3;
constexpr int64_t kBandwidthBytes = int64_t{1} << 30;

const moe::MoeConfig& config() {
  static const moe::MoeConfig c = moe::preset_config("qwen3-30b-a3b");
  return c;
}

int threads() { return omp_get_max_threads(); }

double bandwidth_gb_s() {
  static const double gb_s = moe::cli::measure_read_bandwidth(threads(), kBandwidthBytes, 5);
  return gb_s;
}

// The weight copies of one path, built on first use and kept for the whole run.
std::vector<moe::MoeLayer>& copies(moe::CpuIsa isa) {
  static std::map<moe::CpuIsa, std::vector<moe::MoeLayer>> by_path;
  std::vector<moe::MoeLayer>& layers = by_path[isa];
  if (layers.empty()) {
    const moe::LayerWeights weights = moe::synthetic_layer_weights(config(), moe::DType::kBF16, 0);
    for (int c = 0; c < kCopies; ++c) {
      layers.emplace_back(config(), weights,
                          moe::LayerOptions{moe::Backend::kCpu, threads(), 0, isa});
    }
  }
  return layers;
}

void experts(benchmark::State& state, moe::CpuIsa isa) {
  const int64_t tokens = state.range(0);
  std::vector<moe::MoeLayer>& layers = copies(isa);
  const int64_t H = config().experts.hidden_size;
  const moe::Tensor hidden = moe::Tensor::zeros(moe::DType::kBF16, {tokens, H});
  moe::Tensor out(moe::DType::kBF16, {tokens, H});
  const double peak = moe::cli::measure_peak_flops(isa, moe::DType::kBF16, threads());
  double floor_s = 0, total_s = 0;
  int64_t calls = 0;
  for (auto _ : state) {
    const moe::cli::Routing routing = moe::cli::uniform_routing(
        tokens, config().routing.num_experts, config().routing.top_k, 17 + calls);
    const moe::cli::ExpertsWork work =
        moe::cli::experts_work(config(), moe::DType::kBF16, tokens, routing.experts_touched);
    floor_s += std::max(work.bytes / (bandwidth_gb_s() * 1e9), work.flops / peak);
    // Timed by hand: only the call, not the routing drawn for it.
    const auto start = std::chrono::steady_clock::now();
    layers[static_cast<size_t>(calls++ % kCopies)].forward_experts(hidden, routing.ids,
                                                                   routing.weights, out);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    total_s += seconds;
  }
  state.counters["floor_ms"] = floor_s * 1e3 / static_cast<double>(calls);
  state.counters["floor_fraction"] = floor_s / total_s;
  state.counters["bandwidth_gb_s"] = bandwidth_gb_s();
  state.counters["peak_tflops"] = peak * 1e-12;
  state.SetLabel(std::string(moe::cpu_isa_name(isa)));
}

// One family per supported path, registered at start-up.
const bool registered = [] {
  for (moe::CpuIsa isa : moe::supported_cpu_isas()) {
    const std::string name = "Experts/qwen3_bf16/" + std::string(moe::cpu_isa_name(isa));
    benchmark::RegisterBenchmark(name.c_str(), experts, isa)
        ->Arg(1)
        ->Arg(16)
        ->Arg(256)
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime()
        ->MinTime(1.0);
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
