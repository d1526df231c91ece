#include "parallel/ep_case.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/random_tensors.h"
#include "common/small_family_config.h"
#include "parallel/rank_threads.h"

namespace moe::testing {

MoeConfig small_ep_config(const std::string& family, int64_t num_experts) {
  MoeConfig c = small_family_config(family);
  c.routing.num_experts = num_experts;
  if (family == "deepseek") {
    c.routing.num_groups = 4;  // groups of num_experts / 4, 2 kept
    c.routing.topk_groups = 2;
    c.routing.top_k = 4;
  } else {
    c.routing.top_k = std::min<int64_t>(c.routing.top_k, 4);
  }
  return c;
}

std::string EpCase::describe() const {
  std::string text = fmt::format(
      "{} E={} H={} {} N={} {}{}{} seed={} steps", family, num_experts, hidden_size,
      dtype_name(dtype), num_ranks, dispatcher_name(options.dispatcher),
      options.two_batch_overlap ? "+tbo" : "", map && map->has_replicas() ? " replicas" : "", seed);
  for (const auto& step : steps) text += fmt::format(" [{}]", fmt::join(step, ","));
  return text;
}

EpCaseData prepare_ep_case(const EpCase& c) {
  EpCaseData data;
  data.config = small_ep_config(c.family, c.num_experts);
  data.config.experts.hidden_size = c.hidden_size;
  data.full = synthetic_layer_weights(data.config, c.dtype, c.seed);
  if (c.edit_weights) c.edit_weights(data.full);
  data.map = c.map ? *c.map : ExpertMap::contiguous(c.num_experts, c.num_ranks);
  MoeLayer single(data.config, data.full, LayerOptions{Backend::kCpu, 1, c.options.block_m});
  for (size_t s = 0; s < c.steps.size(); ++s) {
    std::vector<int64_t> first;
    int64_t total = 0;
    for (int64_t tokens : c.steps[s]) {
      first.push_back(total);
      total += tokens;
    }
    data.first_row.push_back(first);
    data.hidden.push_back(
        random_normal(c.dtype, {total, data.config.experts.hidden_size}, c.seed * 100 + s));
    data.expected.push_back(single.forward(data.hidden.back()));
  }
  return data;
}

void run_ep_rank(const EpCase& c, const EpCaseData& data, Communicator& comm,
                 EpRankResult& result) {
  const int r = comm.rank();
  const int64_t H = data.config.experts.hidden_size;
  const size_t value_bytes = dtype_size(c.dtype);
  EpOptions options = c.options;
  options.num_threads = 1;
  EpMoeLayer layer(data.config, local_layer_weights(data.full, *data.map, r), *data.map, comm,
                   options);
  result.stats.resize(c.steps.size());
  for (size_t s = 0; s < c.steps.size(); ++s) {
    const int64_t M = c.steps[s][static_cast<size_t>(r)], first = data.first_row[s][r];
    Tensor mine(c.dtype, {M, H});
    if (M > 0) {
      std::memcpy(mine.data<char>(), data.hidden[s].data<char>() + first * H * value_bytes,
                  mine.nbytes());
    }
    const Tensor out = layer.forward(mine);
    result.stats[s] = layer.last_stats();
    const char* want = data.expected[s].data<char>() + first * H * value_bytes;
    for (int64_t i = 0; i < M * H; ++i) {
      if (std::memcmp(out.data<char>() + i * value_bytes, want + i * value_bytes, value_bytes) ==
          0) {
        continue;
      }
      if (result.mismatches++ == 0) {
        result.first_mismatch =
            fmt::format("step {} rank {} token {} column {}: got {}, single process {}", s, r,
                        i / H, i % H, element(out, i), element(data.expected[s], first * H + i));
      }
    }
  }
}

EpRun run_ep_case(const EpCase& c, bool expect_errors) {
  SCOPED_TRACE(c.describe());
  const EpCaseData data = prepare_ep_case(c);
  std::vector<EpRankResult> results(static_cast<size_t>(c.num_ranks));
  EpRun run;
  run.errors =
      run_rank_threads(c.num_ranks,
                       [&](Communicator& comm) {
                         run_ep_rank(c, data, comm, results[static_cast<size_t>(comm.rank())]);
                       },
                       {.ranks_per_host = c.ranks_per_host});
  run.stats.assign(c.steps.size(), std::vector<EpStepStats>(static_cast<size_t>(c.num_ranks)));
  for (int r = 0; r < c.num_ranks; ++r) {
    const EpRankResult& result = results[static_cast<size_t>(r)];
    for (size_t s = 0; s < result.stats.size(); ++s) run.stats[s][r] = result.stats[s];
    run.mismatches += result.mismatches;
    if (!expect_errors) {
      EXPECT_EQ(run.errors[r], "") << "rank " << r;
      EXPECT_EQ(result.mismatches, 0)
          << result.mismatches << " elements differ; first: " << result.first_mismatch;
    }
  }
  return run;
}

}  // namespace moe::testing
