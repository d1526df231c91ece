#include "parallel/ep_case.h"

#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/random_tensors.h"
#include "parallel/rank_threads.h"

namespace moe::testing {

MoeConfig small_ep_config(const std::string& family, int64_t num_experts) {
  MoeConfig c = preset_config(family == "deepseek" ? "deepseek-v3"
                              : family == "qwen2"  ? "qwen2-moe-a2.7b"
                                                   : "qwen3-30b-a3b");
  c.experts.hidden_size = 40;
  c.experts.intermediate_size = 24;
  if (c.experts.shared_intermediate_size > 0) c.experts.shared_intermediate_size = 20;
  c.routing.num_experts = num_experts;
  if (family == "deepseek") {
    c.routing.num_groups = 4;  // groups of num_experts / 4, 2 kept
    c.routing.topk_groups = 2;
    c.routing.top_k = 4;
  } else {
    c.routing.top_k = std::min<int64_t>(c.routing.top_k, 4);
  }
  if (family == "llama4") {
    c.routing.scoring = ScoringFunc::kSigmoid;
    c.routing.top_k = 1;
    c.routing.renormalize = false;
    c.routing.apply_weight_on_input = true;
    c.experts.shared_intermediate_size = 24;
  }
  if (family == "gpt-oss") {
    c.routing.has_router_bias = true;
    c.routing.renormalize = true;
    c.experts.activation = Activation::kClampedSwiglu;
    c.experts.has_bias = true;
  }
  return c;
}

std::string EpCase::describe() const {
  std::string text = fmt::format("{} E={} {} N={} {}{}{} seed={} steps", family, num_experts,
                                 dtype_name(dtype), num_ranks, dispatcher_name(options.dispatcher),
                                 options.two_batch_overlap ? "+tbo" : "",
                                 map && map->has_replicas() ? " replicas" : "", seed);
  for (const auto& step : steps) text += fmt::format(" [{}]", fmt::join(step, ","));
  return text;
}

EpRun run_ep_case(const EpCase& c, bool expect_errors) {
  SCOPED_TRACE(c.describe());
  const MoeConfig config = small_ep_config(c.family, c.num_experts);
  LayerWeights full = synthetic_layer_weights(config, c.dtype, c.seed);
  if (c.edit_weights) c.edit_weights(full);
  const ExpertMap map = c.map ? *c.map : ExpertMap::contiguous(c.num_experts, c.num_ranks);
  const int64_t H = config.experts.hidden_size;
  const size_t value_bytes = dtype_size(c.dtype);

  // Per step: the whole batch, the single-process output and each rank's first row.
  struct Step {
    Tensor hidden, expected;
    std::vector<int64_t> first_row;
  };
  std::vector<Step> steps;
  MoeLayer single(config, full, LayerOptions{Backend::kCpu, 1, c.options.block_m});
  for (size_t s = 0; s < c.steps.size(); ++s) {
    Step step;
    int64_t total = 0;
    for (int64_t tokens : c.steps[s]) {
      step.first_row.push_back(total);
      total += tokens;
    }
    step.hidden = random_normal(c.dtype, {total, H}, c.seed * 100 + s);
    step.expected = single.forward(step.hidden);
    steps.push_back(std::move(step));
  }

  EpRun run;
  run.stats.assign(c.steps.size(), std::vector<EpStepStats>(static_cast<size_t>(c.num_ranks)));
  std::vector<int64_t> mismatches(static_cast<size_t>(c.num_ranks), 0);
  std::vector<std::string> first_mismatch(static_cast<size_t>(c.num_ranks));
  run.errors = run_rank_threads(
      c.num_ranks,
      [&](Communicator& comm) {
        const int r = comm.rank();
        EpOptions options = c.options;
        options.num_threads = 1;
        EpMoeLayer layer(config, local_layer_weights(full, map, r), map, comm, options);
        for (size_t s = 0; s < steps.size(); ++s) {
          const int64_t M = c.steps[s][static_cast<size_t>(r)], first = steps[s].first_row[r];
          Tensor mine(c.dtype, {M, H});
          if (M > 0) {
            std::memcpy(mine.data<char>(), steps[s].hidden.data<char>() + first * H * value_bytes,
                        mine.nbytes());
          }
          const Tensor out = layer.forward(mine);
          run.stats[s][static_cast<size_t>(r)] = layer.last_stats();
          const char* want = steps[s].expected.data<char>() + first * H * value_bytes;
          for (int64_t i = 0; i < M * H; ++i) {
            if (std::memcmp(out.data<char>() + i * value_bytes, want + i * value_bytes,
                            value_bytes) != 0) {
              if (mismatches[r]++ == 0) {
                first_mismatch[r] = fmt::format(
                    "step {} rank {} token {} column {}: got {}, single process {}", s, r, i / H,
                    i % H, element(out, i), element(steps[s].expected, first * H + i));
              }
            }
          }
        }
      },
      {.ranks_per_host = c.ranks_per_host});
  for (int r = 0; r < c.num_ranks; ++r) {
    run.mismatches += mismatches[r];
    if (!expect_errors) {
      EXPECT_EQ(run.errors[r], "") << "rank " << r;
      EXPECT_EQ(mismatches[r], 0) << mismatches[r]
                                  << " elements differ; first: " << first_mismatch[r];
    }
  }
  return run;
}

}  // namespace moe::testing
