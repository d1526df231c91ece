#include "tools/moe/cuda_bench.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/fill_random.h"
#include "kernels/cuda/fused_experts.h"
#include "kernels/experts_problem.h"
#include "moe/error.h"
#include "ops/cuda_plan_choice.h"
#include "ops/cuda_plan_table.h"
#include "tools/moe/experts_sweep.h"
#include "tools/moe/plan_finalists.h"
#include "tools/moe/turn_order.h"

namespace moe::cli {
namespace {

using cuda::check;
using cuda_plans::parse_plan_name;
using cuda_plans::plan_name;

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Times `body` (queued on `stream`) with events: median over `repeats` after two warm-ups.
template <typename Body>
double median_us(cudaStream_t stream, int repeats, Body body) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> times;
  for (int i = 0; i < repeats + 2; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    body();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (i >= 2) times.push_back(ms * 1000.0);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(times);
}

// Min, median and max of `values` (not empty).
void min_median_max(std::vector<double> values, double out[3]) {
  std::sort(values.begin(), values.end());
  out[0] = values.front();
  out[1] = values[values.size() / 2];
  out[2] = values.back();
}

TimelineSummary summarize(const cuda::ExpertsRunner::Timeline& timeline, double replay_us) {
  std::vector<double> gemm1_end, gemm2_start, gemm2_end;
  for (const auto& span : timeline.spans) {
    if (span.gemm == 1) {
      gemm1_end.push_back(span.end_us);
    } else {
      gemm2_start.push_back(span.start_us);
      gemm2_end.push_back(span.end_us);
    }
  }
  TimelineSummary summary;
  summary.gemm1_blocks = static_cast<int>(gemm1_end.size());
  summary.gemm2_blocks = static_cast<int>(gemm2_end.size());
  if (!gemm1_end.empty()) min_median_max(gemm1_end, summary.gemm1_end);
  if (!gemm2_end.empty()) {
    min_median_max(gemm2_start, summary.gemm2_start);
    min_median_max(gemm2_end, summary.gemm2_end);
  }
  summary.marks = timeline.marks;
  summary.replay_us = replay_us;
  return summary;
}

// The plans worth timing at this size: the stream kernel re-reads an expert's weights for every
// block of rows, so it is skipped once experts average more than two blocks' worth, and the tiny
// batch (a block per pair) past one pair per expert.
std::vector<cuda::ExpertsPlan> candidate_plans(const ExpertsProblem& problem) {
  std::vector<cuda::ExpertsPlan> plans;
  const int64_t pairs = problem.num_tokens * problem.top_k;
  const double rows_per_expert = static_cast<double>(pairs) / problem.num_experts;
  if (pairs <= problem.num_experts) {
    plans.push_back({cuda::GemmKernel::kStream, 1, true});
    const cuda::ExpertsPlan decode{cuda::GemmKernel::kDecode, 1, true};
    if (cuda::why_plan_cannot_run(decode, problem).empty()) plans.push_back(decode);
  }
  for (int64_t block_m : {4, 16}) {
    if (rows_per_expert <= 2.0 * block_m) {
      plans.push_back({cuda::GemmKernel::kStream, block_m, false});
    }
  }
  if (rows_per_expert >= 1) {
    for (int64_t block_m : {16, 32, 64, 128}) {
      plans.push_back({cuda::GemmKernel::kMma, block_m, false});
    }
    if (cuda::wgmma_available()) {
      for (const cuda::GemmKernel kernel :
           {cuda::GemmKernel::kWgmma, cuda::GemmKernel::kTma, cuda::GemmKernel::kTmaEager,
            cuda::GemmKernel::kTmaPair, cuda::GemmKernel::kTmaDynamic}) {
        for (int64_t block_m : {16, 64, 128}) {
          // Short blocks (no wgmma kernel) only where an expert's pairs mostly fit one.
          if (block_m == 16 && (kernel == cuda::GemmKernel::kWgmma || rows_per_expert > 16)) {
            continue;
          }
          plans.push_back({kernel, block_m, false});
        }
      }
    }
  }
  return plans;
}

// One routing set's pairs, on the host.
struct RoutingSet {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  int64_t distinct = 0;
};

// k distinct uniform experts per token, weights that sum to one.
RoutingSet random_routing(int64_t tokens, int64_t k, int64_t experts, std::mt19937_64& rng) {
  RoutingSet r;
  r.ids.resize(tokens * k);
  r.weights.resize(tokens * k);
  std::vector<int32_t> pool(experts);
  std::vector<bool> touched(experts, false);
  std::uniform_real_distribution<float> uniform(0.1f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(pool.begin(), pool.end(), 0);
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      std::swap(pool[j], pool[j + rng() % (experts - j)]);
      r.ids[t * k + j] = pool[j];
      touched[pool[j]] = true;
      r.weights[t * k + j] = uniform(rng);
      sum += r.weights[t * k + j];
    }
    for (int64_t j = 0; j < k; ++j) r.weights[t * k + j] /= sum;
  }
  r.distinct = std::count(touched.begin(), touched.end(), true);
  return r;
}

// experts_sweep.h's balanced routing, pairs from `first` on.
RoutingSet balanced_routing_set(int64_t tokens, int64_t k, int64_t experts, int64_t first) {
  RoutingSet r;
  r.ids.resize(tokens * k);
  r.weights.assign(tokens * k, 1.0f / static_cast<float>(k));
  for (int64_t p = 0; p < tokens * k; ++p) r.ids[p] = balanced_expert(first, p, experts);
  r.distinct = std::min(tokens * k, experts);
  return r;
}

void upload(cuda::DeviceBuffer& buffer, const void* host, size_t bytes) {
  buffer.reserve(std::max<size_t>(bytes, 1));
  check(cudaMemcpy(buffer.data(), host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

// One plan at one token count: its row, its runner, and a graph of one call per routing set. Every
// plan of a size keeps its runner's workspace until all are timed (with --sweep at DeepSeek-V3's
// 16384 tokens: 14 plans of up to 2.5 GB each).
struct TimedPlan {
  CudaBenchRow row;
  std::unique_ptr<cuda::ExpertsRunner> runner;
  std::vector<cudaGraphExec_t> graphs;
  std::vector<double> replays;  // microseconds, in the order they ran
};

// Fills the row's per-stage split from un-captured calls and captures the graphs.
void prepare(TimedPlan& t, const cuda::ExpertsPlan& plan,
             const std::vector<ExpertsProblem>& problems, bool timeline, cudaStream_t stream) {
  t.runner = std::make_unique<cuda::ExpertsRunner>();
  cuda::ExpertsRunner& runner = *t.runner;
  runner.record_timeline(timeline);
  const int sets = static_cast<int>(problems.size());
  // Un-captured calls first: they size the workspace and give the per-stage split. One call
  // before them is not timed: a kernel's first launch in the process loads its module (lazily),
  // and the events around it counted that as time of its stage.
  runner.run(problems[0], plan, stream);
  for (const ExpertsProblem& problem : problems) {
    StageTimes times;
    runner.run(problem, plan, stream, &times);
    t.row.align_us += times.align_us / sets;
    t.row.gemm1_us += times.gemm1_us / sets;
    t.row.gemm2_us += times.gemm2_us / sets;
    t.row.sum_us += times.sum_us / sets;
  }
  t.row.workspace_bytes = runner.workspace_bytes();
  t.graphs.resize(problems.size());
  for (int s = 0; s < sets; ++s) {
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "BeginCapture");
    runner.run(problems[s], plan, stream);
    check(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&t.graphs[s], graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
  }
}

// Replays the plans in turns, `rounds` times: in each round each plan replays every routing set
// once, in turn_order's order for that round, each replay between its own pair of events. The GPU
// stays busy from the first replay to the last and every plan meets the clock of every part of the
// run. Timed one after another, each right after the host had captured its graphs, a plan's figure
// depended on its place in the run: `tma/128` at Qwen3-30B-A3B's 4096 tokens read 852-919 us over
// four processes, slowest where it came first; in turns 864-865 in two (docs/perf.md,
// thirty-eighth session). Within a turn the routings rotate, so no two consecutive replays read
// the same experts' weights.
void time_in_turns(const std::vector<TimedPlan*>& plans, int rounds, cudaStream_t stream) {
  if (plans.empty()) return;
  for (TimedPlan* t : plans) {
    for (cudaGraphExec_t graph : t->graphs) check(cudaGraphLaunch(graph, stream), "warm-up");
  }
  const size_t n = plans.size(), sets = plans[0]->graphs.size();
  const size_t count = static_cast<size_t>(rounds) * n * sets;
  std::vector<cudaEvent_t> marks(count + 1);
  for (cudaEvent_t& mark : marks) check(cudaEventCreate(&mark), "cudaEventCreate");
  std::vector<TimedPlan*> owner(count);
  size_t i = 0;
  check(cudaEventRecord(marks[0], stream), "cudaEventRecord");
  for (size_t r = 0; r < static_cast<size_t>(rounds); ++r) {
    for (const size_t j : turn_order(n, r)) {
      TimedPlan* t = plans[j];
      for (cudaGraphExec_t graph : t->graphs) {
        check(cudaGraphLaunch(graph, stream), "cudaGraphLaunch");
        owner[i] = t;
        check(cudaEventRecord(marks[++i], stream), "cudaEventRecord");
      }
    }
  }
  check(cudaEventSynchronize(marks[count]), "cudaEventSynchronize");
  for (size_t m = 0; m < count; ++m) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, marks[m], marks[m + 1]), "cudaEventElapsedTime");
    owner[m]->replays.push_back(ms * 1000.0);
  }
  for (cudaEvent_t mark : marks) cudaEventDestroy(mark);
}

}  // namespace

// From idle a GPU runs at its boost clock until its power, averaged over about a second, reaches
// the board's limit; then the clock drops, for a moment far (0.8-1.0 GHz on the H200s measured,
// 700 W limit), then to what the load allows (1.3-1.7 GHz). Rows timed in that first second ran
// faster than a busy serving GPU does, and the row the drop fell on up to 35% slower
// (docs/perf.md, thirty-seventh session). So the ceilings and the rows are measured after this
// long at the GEMM's full load.
constexpr double kPowerWarmupSeconds = 2.0;

CudaCeilings measure_cuda_ceilings() {
  CudaCeilings c;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  c.device_name = prop.name;
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");

  // Random data: zeros run measurably faster on tensor cores.
  const int n = 8192;
  cuda::DeviceBuffer a, b, out;
  a.reserve(size_t{2} * n * n);
  b.reserve(size_t{2} * n * n);
  out.reserve(size_t{2} * n * n);
  cuda::fill_normal_bf16(a.data(), int64_t{n} * n, 2, 1.0f, stream);
  cuda::fill_normal_bf16(b.data(), int64_t{n} * n, 3, 1.0f, stream);
  cublasHandle_t handle;
  check(cublasCreate(&handle), "cublasCreate");
  check(cublasSetStream(handle, stream), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&] {
    check(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a.data(), CUDA_R_16BF, n,
                       b.data(), CUDA_R_16BF, n, &zero, out.data(), CUDA_R_16BF, n,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  };
  const auto warmup_start = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - warmup_start).count() <
         kPowerWarmupSeconds) {
    for (int i = 0; i < 10; ++i) gemm();
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize(warm-up)");
  }

  const size_t copy_bytes = size_t{2} << 30;
  cuda::DeviceBuffer from, to;
  from.reserve(copy_bytes);
  to.reserve(copy_bytes);
  cuda::fill_normal_bf16(from.data(), copy_bytes / 2, 1, 1.0f, stream);
  const double copy_us = median_us(stream, 10, [&] {
    check(cudaMemcpyAsync(to.data(), from.data(), copy_bytes, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
  });
  c.copy_bytes_per_s = 2.0 * copy_bytes / (copy_us * 1e-6);

  const double gemm_us = median_us(stream, 10, gemm);
  c.bf16_flops_per_s = 2.0 * n * n * static_cast<double>(n) / (gemm_us * 1e-6);
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
  return c;
}

std::vector<CudaBenchRow> run_cuda_bench(const MoeConfig& config, const CudaBenchOptions& options,
                                         const CudaCeilings& ceilings) {
  const int64_t H = config.experts.hidden_size, I = config.experts.intermediate_size;
  const int64_t E = config.routing.num_experts, k = config.routing.top_k;
  if (options.routing_sets < 1 || options.repeats < 1) {
    fail("bench: expected at least one routing set and one repeat; got {} and {}",
         options.routing_sets, options.repeats);
  }
  const auto start = std::chrono::steady_clock::now();
  cudaStream_t stream;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");

  cuda::DeviceBuffer w13, w2, hidden, out;
  w13.reserve(static_cast<size_t>(E * 2 * I * H) * 2);
  w2.reserve(static_cast<size_t>(E * H * I) * 2);
  // Weights scaled so each projection keeps activations of order one.
  cuda::fill_normal_bf16(w13.data(), E * 2 * I * H, options.seed + 1,
                         1.0f / std::sqrt(static_cast<float>(H)), stream);
  cuda::fill_normal_bf16(w2.data(), E * H * I, options.seed + 2,
                         1.0f / std::sqrt(static_cast<float>(I)), stream);

  std::vector<CudaBenchRow> rows;
  std::mt19937_64 rng(options.seed);
  for (const int64_t tokens : options.tokens) {
    hidden.reserve(std::max<size_t>(static_cast<size_t>(tokens * H) * 2, 16));
    out.reserve(std::max<size_t>(static_cast<size_t>(tokens * H) * 2, 16));
    cuda::fill_normal_bf16(hidden.data(), tokens * H, options.seed + 3, 1.0f, stream);

    std::vector<cuda::DeviceBuffer> ids(options.routing_sets), weights(options.routing_sets);
    std::vector<ExpertsProblem> problems(options.routing_sets);
    double distinct = 0;
    for (int s = 0; s < options.routing_sets; ++s) {
      // Balanced sets follow each other, so small batches still touch other experts each time.
      const RoutingSet routing = options.balanced
                                     ? balanced_routing_set(tokens, k, E, s * tokens * k)
                                     : random_routing(tokens, k, E, rng);
      distinct += static_cast<double>(routing.distinct) / options.routing_sets;
      upload(ids[s], routing.ids.data(), routing.ids.size() * sizeof(int32_t));
      upload(weights[s], routing.weights.data(), routing.weights.size() * sizeof(float));
      ExpertsProblem& p = problems[s];
      p.num_tokens = tokens;
      p.hidden_size = H;
      p.intermediate_size = I;
      p.top_k = k;
      p.num_experts = E;
      p.num_local_experts = E;
      p.hidden = hidden.data();
      p.hidden_dtype = DType::kBF16;
      p.w13 = w13.data();
      p.w2 = w2.data();
      p.weight_dtype = DType::kBF16;
      p.topk_ids = static_cast<const int32_t*>(ids[s].data());
      p.topk_weights = static_cast<const float*>(weights[s].data());
      p.out = out.data();
    }

    const cuda::ExpertsPlan default_plan = cuda::default_plan(problems[0]);
    const cuda::ExpertsPlan chosen = cuda_plans::choose_plan(problems[0], ceilings.device_name);
    const std::string chosen_name = plan_name(chosen);
    std::vector<cuda::ExpertsPlan> plans = {default_plan};
    auto add_plan = [&plans](const cuda::ExpertsPlan& plan) {
      const bool listed = std::any_of(plans.begin(), plans.end(), [&](const auto& p) {
        return plan_name(p) == plan_name(plan);
      });
      if (!listed) plans.push_back(plan);
    };
    add_plan(chosen);
    if (options.sweep) {
      for (const cuda::ExpertsPlan& plan : candidate_plans(problems[0])) add_plan(plan);
    }
    for (const std::string& name : options.plans) add_plan(parse_plan_name(name));
    std::vector<TimedPlan> timed(plans.size());
    std::vector<TimedPlan*> runnable;
    for (size_t i = 0; i < plans.size(); ++i) {
      CudaBenchRow& row = timed[i].row;
      row.tokens = tokens;
      row.plan = plan_name(plans[i]);
      row.is_default = i == 0;
      row.is_chosen = row.plan == chosen_name;
      row.distinct_experts = distinct;
      row.weight_bytes = distinct * 3.0 * static_cast<double>(H * I) * 2.0;
      row.flops = 6.0 * static_cast<double>(tokens * k) * static_cast<double>(H * I);
      row.floor_us = std::max(row.weight_bytes / ceilings.copy_bytes_per_s,
                              row.flops / ceilings.bf16_flops_per_s) *
                     1e6;
      // A plan asked for by name may not take every size (decode/1 past 8 tokens).
      row.cannot_run = cuda::why_plan_cannot_run(plans[i], problems[0]);
      if (!row.cannot_run.empty()) continue;
      prepare(timed[i], plans[i], problems, options.timeline, stream);
      runnable.push_back(&timed[i]);
    }
    time_in_turns(runnable, options.repeats, stream);
    std::vector<double> medians;
    for (TimedPlan* t : runnable) {
      t->row.median_us = median(t->replays);
      t->row.min_us = *std::min_element(t->replays.begin(), t->replays.end());
      medians.push_back(t->row.median_us);
    }
    std::vector<TimedPlan*> final_round;
    if (options.finalist_margin > 0) {
      for (const size_t i : plan_finalists(medians, options.finalist_margin)) {
        final_round.push_back(runnable[i]);
        runnable[i]->replays.clear();
      }
      time_in_turns(final_round, options.repeats, stream);
      for (TimedPlan* t : final_round) t->row.final_us = median(t->replays);
    }
    if (!options.progress_label.empty()) {
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
      fmt::print(
          stderr, "{}: {} tokens, {} plans timed{} ({:.1f} s so far)\n", options.progress_label,
          tokens, runnable.size(),
          final_round.empty() ? "" : fmt::format(", {} again in a final round", final_round.size()),
          elapsed.count());
    }
    for (TimedPlan& t : timed) {
      for (cudaGraphExec_t graph : t.graphs) cudaGraphExecDestroy(graph);
      if (options.timeline && !t.replays.empty()) {
        t.row.timeline = summarize(t.runner->read_timeline(stream), t.replays.back());
      }
      rows.push_back(t.row);
    }
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaStreamDestroy(stream);
  return rows;
}

namespace {

// After the plan's name: * the built-in default, + the tuned table's plan where it differs.
std::string marker(const CudaBenchRow& r) {
  if (r.is_default) return "*";
  return r.is_chosen ? "+" : " ";
}

// --timeline: one line per row whose plan recorded its thread blocks.
void print_timelines(const std::vector<CudaBenchRow>& rows) {
  fmt::print(
      "\ntimeline of the last replay (tma plans), us from gemm1's first thread block's start, "
      "min / median / max over thread blocks:\n");
  fmt::print("{:>6} {:>10} {:>7} {:>22} {:>7} {:>22} {:>22}\n", "tokens", "plan", "blocks",
             "gemm1 end", "blocks", "gemm2 start", "gemm2 end");
  auto triple = [](const double v[3]) {
    return fmt::format("{:.1f} / {:.1f} / {:.1f}", v[0], v[1], v[2]);
  };
  for (const CudaBenchRow& r : rows) {
    const TimelineSummary& t = r.timeline;
    if (!r.cannot_run.empty() || t.gemm1_blocks == 0) continue;
    fmt::print("{:>6} {:>10} {:>7} {:>22} {:>7} {:>22} {:>22}\n", r.tokens, r.plan + marker(r),
               t.gemm1_blocks, triple(t.gemm1_end), t.gemm2_blocks, triple(t.gemm2_start),
               triple(t.gemm2_end));
  }
  fmt::print(
      "\nstage marks of the same replay (the stream reaching each point; same origin, or the "
      "start mark where no thread block recorded one) and the replay's time between its events:\n");
  fmt::print("{:>6} {:>10} {:>9} {:>9} {:>9} {:>9} {:>11} {:>9}\n", "tokens", "plan", "replay",
             "start", "aligned", "gathered", "gemm2 done", "done");
  auto value = [](double us) {
    return std::isnan(us) ? std::string("-") : fmt::format("{:.1f}", us);
  };
  for (const CudaBenchRow& r : rows) {
    const TimelineSummary& t = r.timeline;
    if (!r.cannot_run.empty() || std::isnan(t.marks.start_us)) continue;
    fmt::print("{:>6} {:>10} {:>9.1f} {:>9} {:>9} {:>9} {:>11} {:>9}\n", r.tokens,
               r.plan + marker(r), t.replay_us, value(t.marks.start_us), value(t.marks.aligned_us),
               value(t.marks.gathered_us), value(t.marks.gemm2_done_us), value(t.marks.done_us));
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) fail("--output: cannot open '{}' for writing", path);
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (std::fclose(file) != 0 || !written) fail("--output: cannot write '{}'", path);
}

}  // namespace

void run_cuda_bench_command(const CudaBenchCommand& o) {
  const MoeConfig config = resolve_config(o.preset);
  for (const std::string& name : o.plans) parse_plan_name(name);  // a typo fails before timing
  const CudaCeilings ceilings = measure_cuda_ceilings();
  CudaBenchOptions options;
  options.tokens = o.tokens;
  options.repeats = o.repeats;
  options.sweep = o.sweep;
  options.plans = o.plans;
  options.seed = o.seed;
  options.balanced = o.balanced;
  options.timeline = o.timeline;
  options.finalist_margin = o.final_round ? kFinalistMargin : 0;
  options.progress_label = "moe bench";
  const std::vector<CudaBenchRow> rows = run_cuda_bench(config, options, ceilings);

  {
    nlohmann::json report = {{"preset", o.preset},
                             {"device", ceilings.device_name},
                             {"copy_bytes_per_s", ceilings.copy_bytes_per_s},
                             {"bf16_flops_per_s", ceilings.bf16_flops_per_s},
                             {"routing", o.balanced ? "balanced" : "uniform"},
                             {"rows", nlohmann::json::array()}};
    for (const CudaBenchRow& r : rows) {
      if (!r.cannot_run.empty()) {
        report["rows"].push_back(
            {{"tokens", r.tokens}, {"plan", r.plan}, {"cannot_run", r.cannot_run}});
        continue;
      }
      report["rows"].push_back({{"tokens", r.tokens},
                                {"plan", r.plan},
                                {"default", r.is_default},
                                {"chosen", r.is_chosen},
                                {"median_us", r.median_us},
                                {"min_us", r.min_us},
                                {"floor_us", r.floor_us},
                                {"align_us", r.align_us},
                                {"gemm1_us", r.gemm1_us},
                                {"gemm2_us", r.gemm2_us},
                                {"sum_us", r.sum_us},
                                {"distinct_experts", r.distinct_experts},
                                {"weight_bytes", r.weight_bytes},
                                {"flops", r.flops},
                                {"workspace_bytes", r.workspace_bytes}});
      if (r.final_us > 0) report["rows"].back()["final_us"] = r.final_us;
      const TimelineSummary& t = r.timeline;
      if (o.timeline && r.cannot_run.empty()) {
        auto triple = [](const double v[3]) { return nlohmann::json::array({v[0], v[1], v[2]}); };
        // NaN (no such stage) as null.
        auto mark = [](double us) {
          return std::isnan(us) ? nlohmann::json() : nlohmann::json(us);
        };
        nlohmann::json& timeline = report["rows"].back()["timeline"];
        timeline = {{"replay_us", t.replay_us},
                    {"start_mark_us", mark(t.marks.start_us)},
                    {"aligned_mark_us", mark(t.marks.aligned_us)},
                    {"gathered_mark_us", mark(t.marks.gathered_us)},
                    {"gemm2_done_mark_us", mark(t.marks.gemm2_done_us)},
                    {"done_mark_us", mark(t.marks.done_us)}};
        if (t.gemm1_blocks > 0) {
          timeline.update({{"gemm1_blocks", t.gemm1_blocks},
                           {"gemm2_blocks", t.gemm2_blocks},
                           {"gemm1_end_us", triple(t.gemm1_end)},
                           {"gemm2_start_us", triple(t.gemm2_start)},
                           {"gemm2_end_us", triple(t.gemm2_end)}});
        }
      }
    }
    if (!o.output.empty()) write_text(o.output, report.dump(2) + "\n");
    if (o.json) {
      std::printf("%s\n", report.dump(2).c_str());
      return;
    }
  }
  fmt::print(
      "moe bench: {} (H {}, I {}, E {}, k {}) bf16 on {}\n"
      "ceilings measured in this run, after {:.0f} s of GEMMs at full load (the board at its power "
      "limit): copy {:.2f} TB/s (read + write), bf16 GEMM {:.0f} TFLOP/s\n"
      "times: median of CUDA-graph replays over 8 rotating {} routings, the plans of a size "
      "replayed in turns; stages: mean of one un-captured call per routing, after an untimed "
      "one\n\n",
      o.preset, config.experts.hidden_size, config.experts.intermediate_size,
      config.routing.num_experts, config.routing.top_k, ceilings.device_name, kPowerWarmupSeconds,
      ceilings.copy_bytes_per_s / 1e12, ceilings.bf16_flops_per_s / 1e12,
      o.balanced ? "balanced" : "uniform");
  if (o.final_round) {
    fmt::print(
        "final us: median of a final round after each size's, the plans within {:.0f}% of its best "
        "replayed again, alone in turns (- : not in it); the other columns are from the first\n\n",
        100.0 * kFinalistMargin);
  }
  // The final round's column, only where one was asked for.
  auto final_column = [&](const CudaBenchRow& r) -> std::string {
    if (!o.final_round) return "";
    return r.final_us > 0 ? fmt::format(" {:>9.1f}", r.final_us) : fmt::format(" {:>9}", "-");
  };
  fmt::print("{:>6} {:>10} {:>10}{} {:>9} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8}\n",
             "tokens", "plan", "us", o.final_round ? fmt::format(" {:>9}", "final us") : "",
             "floor us", "floor %", "TFLOP/s", "TB/s", "align", "gemm1", "gemm2", "sum", "experts",
             "work MB");
  for (const CudaBenchRow& r : rows) {
    if (!r.cannot_run.empty()) {
      fmt::print("{:>6} {:>10}  cannot run: {}\n", r.tokens, r.plan + " ", r.cannot_run);
      continue;
    }
    fmt::print(
        "{:>6} {:>10} {:>10.1f}{} {:>9.1f} {:>7.0f}% {:>8.1f} {:>7.2f} {:>7.1f} {:>7.1f} {:>7.1f} "
        "{:>7.1f} {:>7.1f} {:>8.0f}\n",
        r.tokens, r.plan + marker(r), r.median_us, final_column(r), r.floor_us,
        100.0 * r.floor_us / r.median_us, r.flops / r.median_us / 1e6,
        r.weight_bytes / r.median_us / 1e6, r.align_us, r.gemm1_us, r.gemm2_us, r.sum_us,
        r.distinct_experts, r.workspace_bytes / 1e6);
  }
  fmt::print(
      "\n* the built-in default plan; + the tuned table's plan (configs/cuda, moe tune), which a "
      "call of that size runs instead where one is listed; TB/s counts the distinct experts' "
      "weights only; decode/1 runs every stage in one launch, shown as gemm1\n");
  if (o.timeline) print_timelines(rows);
}

}  // namespace moe::cli
