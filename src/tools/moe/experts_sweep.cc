#include "tools/moe/experts_sweep.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/cpu/tile_kernel.h"
#include "moe/error.h"
#include "tools/moe/batch_report.h"

namespace moe::cli {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Sums a slice with eight independent 16-byte accumulators and a software prefetch 2 KiB ahead,
// as the kernels prefetch their weights: enough loads in flight to stream at full speed.
uint64_t sum_slice(const uint64_t* data, int64_t count) {
  typedef uint64_t Pair __attribute__((vector_size(16)));
  constexpr int64_t kStep = 16;            // 128 bytes per iteration
  constexpr int64_t kPrefetchAhead = 256;  // elements: 2 KiB
  Pair acc[kStep / 2] = {};
  int64_t i = 0;
  for (; i + kStep <= count; i += kStep) {
    __builtin_prefetch(data + i + kPrefetchAhead);
    __builtin_prefetch(data + i + kPrefetchAhead + 8);
    for (int a = 0; a < kStep / 2; ++a) {
      Pair v;
      std::memcpy(&v, data + i + 2 * a, sizeof v);
      acc[a] += v;
    }
  }
  uint64_t sum = 0;
  for (const Pair& a : acc) sum += a[0] + a[1];
  for (; i < count; ++i) sum += data[i];
  return sum;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The routing's statistics from its pairs per expert.
void count_rows(Routing& r, const std::vector<int64_t>& rows) {
  r.rows_min = INT64_MAX;
  int64_t pairs = 0;
  for (int64_t count : rows) {
    pairs += count;
    if (count == 0) continue;
    ++r.experts_touched;
    r.rows_min = std::min(r.rows_min, count);
    r.rows_max = std::max(r.rows_max, count);
  }
  if (r.experts_touched == 0) r.rows_min = 0;
  r.rows_mean = r.experts_touched ? static_cast<double>(pairs) / r.experts_touched : 0;
}

}  // namespace

double measure_read_bandwidth(int threads, int64_t bytes, int passes) {
  const int64_t count = bytes / static_cast<int64_t>(sizeof(uint64_t));
  std::vector<uint64_t> buffer(static_cast<size_t>(count));
  // Each thread first-touches its own slice, as the layer's threads touch their weights.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < count; ++i) buffer[i] = static_cast<uint64_t>(i);
  double best = 0;
  volatile uint64_t sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    uint64_t total = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
      const int64_t n = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t begin = count * t / n, end = count * (t + 1) / n;
      total += sum_slice(buffer.data() + begin, end - begin);
    }
    const double seconds = seconds_since(start);
    sink = sink + total;
    best = std::max(best, static_cast<double>(count * sizeof(uint64_t)) / seconds * 1e-9);
  }
  return best;
}

double measure_peak_flops(CpuIsa isa, DType weight_dtype, int threads) {
  const cpu::PeakLoop loop = cpu::peak_loop(resolve_cpu_isa(isa), weight_dtype);
  // About 50 ms per run at the path's speed; the first run also calibrates.
  int64_t iterations = 1 << 16;
  double best = 0;
  for (int run = 0; run < 4; ++run) {
    double flops = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
    flops += loop(iterations);
    const double seconds = seconds_since(start);
    if (run > 0) best = std::max(best, flops / seconds);
    iterations = std::max<int64_t>(1, static_cast<int64_t>(iterations * 0.05 / seconds));
  }
  return best;
}

Routing uniform_routing(int64_t tokens, int64_t num_experts, int64_t top_k, uint64_t seed) {
  Routing r;
  r.ids = Tensor(DType::kI32, {tokens, top_k});
  r.weights = Tensor(DType::kF32, {tokens, top_k});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  std::vector<int32_t> experts(static_cast<size_t>(num_experts));
  std::vector<int64_t> rows(static_cast<size_t>(num_experts), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    // The first k of a partial Fisher-Yates shuffle: k distinct experts, uniformly.
    std::iota(experts.begin(), experts.end(), 0);
    float total = 0;
    for (int64_t j = 0; j < top_k; ++j) {
      std::uniform_int_distribution<int64_t> pick(j, num_experts - 1);
      std::swap(experts[j], experts[pick(rng)]);
      r.ids.data<int32_t>()[t * top_k + j] = experts[j];
      ++rows[experts[j]];
      total += r.weights.data<float>()[t * top_k + j] = uniform(rng);
    }
    for (int64_t j = 0; j < top_k; ++j) r.weights.data<float>()[t * top_k + j] /= total;
  }
  count_rows(r, rows);
  return r;
}

int32_t balanced_expert(int64_t first, int64_t pair, int64_t num_experts) {
  return static_cast<int32_t>((first + pair) % num_experts);
}

Routing balanced_routing(int64_t tokens, int64_t num_experts, int64_t top_k, int64_t first) {
  Routing r;
  r.ids = Tensor(DType::kI32, {tokens, top_k});
  r.weights = Tensor(DType::kF32, {tokens, top_k});
  std::vector<int64_t> rows(static_cast<size_t>(num_experts), 0);
  for (int64_t p = 0; p < tokens * top_k; ++p) {
    const int32_t expert = balanced_expert(first, p, num_experts);
    r.ids.data<int32_t>()[p] = expert;
    r.weights.data<float>()[p] = 1.0f / static_cast<float>(top_k);
    ++rows[expert];
  }
  count_rows(r, rows);
  return r;
}

ExpertsWork experts_work(const MoeConfig& config, DType weight_dtype, int64_t tokens,
                         int64_t experts_touched) {
  const double H = static_cast<double>(config.experts.hidden_size);
  const double I = static_cast<double>(config.experts.intermediate_size);
  const double Is = static_cast<double>(config.experts.shared_intermediate_size);
  const double k = static_cast<double>(config.routing.top_k);
  const double bytes_per_weight = static_cast<double>(dtype_size(weight_dtype));
  ExpertsWork w;
  w.bytes = bytes_per_weight * 3 * H *
            (I * static_cast<double>(experts_touched) + (tokens > 0 ? Is : 0.0));
  w.flops = 2.0 * static_cast<double>(tokens) * 3 * H * (k * I + Is);
  return w;
}

std::vector<InterleavedPoint> measure_interleaved(
    const std::vector<std::vector<MoeLayer>*>& variants, const std::vector<double>& peak_flops,
    const SweepSettings& s) {
  if (variants.empty() || variants.size() != peak_flops.size()) {
    fail("moe bench: expected one peak per variant; got {} variants and {} peaks", variants.size(),
         peak_flops.size());
  }
  for (const std::vector<MoeLayer>* copies : variants) {
    if (copies->empty()) fail("moe bench: no layer to time");
  }
  if (s.repeats < 1) fail("--repeats: expected >= 1; got {}", s.repeats);
  const MoeConfig& config = variants.front()->front().config();
  const int64_t H = config.experts.hidden_size, E = config.routing.num_experts;
  const int64_t k = config.routing.top_k;

  Tensor hidden = batch_tensor(s.tokens, H, s.hidden_dtype, "hidden states");
  Tensor out = batch_tensor(s.tokens, H, s.hidden_dtype, "output");
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  fill_batch_rows(hidden, [&] { return normal(rng); });

  struct Call {
    double ms, floor_ms;
    ExpertsWork work;
  };
  const size_t count = variants.size();
  std::vector<std::vector<Call>> calls(count);
  std::vector<Routing> routings;
  const auto budget_start = std::chrono::steady_clock::now();
  for (int r = 0; r < s.repeats; ++r) {
    if (r > 0 && seconds_since(budget_start) > s.budget_s) break;
    // The routing changes every round; within a round every variant gets the same one.
    const int64_t pairs = s.tokens * k;
    routings.push_back(s.balanced ? balanced_routing(s.tokens, E, k, r * pairs)
                                  : uniform_routing(s.tokens, E, k, s.seed + 1 + r));
    const Routing& routing = routings.back();
    for (size_t i = 0; i < count; ++i) {
      const size_t v = (static_cast<size_t>(r) + i) % count;  // the order rotates every round
      std::vector<MoeLayer>& copies = *variants[v];
      MoeLayer& layer = copies[static_cast<size_t>(r) % copies.size()];
      if (static_cast<size_t>(r) < copies.size()) {
        // A copy's first call at this size sizes its workspace and is not timed.
        const Routing warm = s.balanced ? balanced_routing(s.tokens, E, k, (1000 + r) * pairs)
                                        : uniform_routing(s.tokens, E, k, s.seed + 1000 + r);
        layer.forward_experts(hidden, warm.ids, warm.weights, out);
      }
      const auto start = std::chrono::steady_clock::now();
      layer.forward_experts(hidden, routing.ids, routing.weights, out);
      const double ms = seconds_since(start) * 1e3;
      const ExpertsWork work =
          experts_work(config, layer.weight_dtype(), s.tokens, routing.experts_touched);
      const double floor_ms =
          std::max(work.bytes / (s.bandwidth_gb_s * 1e9), work.flops / peak_flops[v]) * 1e3;
      calls[v].push_back({ms, floor_ms, work});
    }
  }

  std::vector<InterleavedPoint> points(count);
  for (size_t v = 0; v < count; ++v) {
    std::vector<double> times, floors, ratios;
    for (size_t r = 0; r < calls[v].size(); ++r) {
      times.push_back(calls[v][r].ms);
      floors.push_back(calls[v][r].floor_ms);
      if (calls[0][r].ms > 0) ratios.push_back(calls[v][r].ms / calls[0][r].ms);
    }
    // The call whose time is the median gives the work figures.
    std::vector<size_t> order(calls[v].size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return calls[v][a].ms < calls[v][b].ms; });
    const size_t middle = order[order.size() / 2];
    const Call& call = calls[v][middle];
    const Routing& routing = routings[middle];
    SweepPoint& p = points[v].point;
    p.tokens = s.tokens;
    p.repeats = static_cast<int>(calls[v].size());
    p.ms = median(times);
    p.floor_ms = median(floors);
    p.bytes = call.work.bytes;
    p.flops = call.work.flops;
    p.bandwidth_bound =
        call.work.bytes / (s.bandwidth_gb_s * 1e9) >= call.work.flops / peak_flops[v];
    p.experts_touched = routing.experts_touched;
    p.rows_min = routing.rows_min;
    p.rows_max = routing.rows_max;
    p.rows_mean = routing.rows_mean;
    // A call too short for the clock leaves no ratio for its round.
    points[v].ratio_to_first =
        ratios.empty() ? std::numeric_limits<double>::quiet_NaN() : median(ratios);
  }
  return points;
}

}  // namespace moe::cli
