#include "tools/moe/ep_bench_passes.h"

#include <algorithm>

namespace moe::cli {

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

EpStepStats pass_totals(const std::vector<EpStepStats>& counted,
                        const std::vector<EpStepStats>& timed) {
  EpStepStats sum = counted.front();
  const auto add = [](auto& into, const auto& from) {
    for (size_t i = 0; i < into.size(); ++i) into[i] += from[i];
  };
  const auto add_split = [](TrafficSplit& into, const TrafficSplit& from) {
    into.self += from.self;
    into.same_host += from.same_host;
    into.cross_host += from.cross_host;
  };
  for (size_t s = 1; s < counted.size(); ++s) {
    const EpStepStats& st = counted[s];
    sum.num_tokens += st.num_tokens;
    sum.num_pairs += st.num_pairs;
    sum.rows_sent += st.rows_sent;
    sum.local_pairs += st.local_pairs;
    sum.pairs_received += st.pairs_received;
    sum.upper_bound_bytes += st.upper_bound_bytes;
    add(sum.dispatch_bytes_sent, st.dispatch_bytes_sent);
    add(sum.dispatch_bytes_received, st.dispatch_bytes_received);
    add(sum.combine_bytes_sent, st.combine_bytes_sent);
    add(sum.combine_bytes_received, st.combine_bytes_received);
    add(sum.pairs_per_local_slot, st.pairs_per_local_slot);
    add_split(sum.dispatch_sent, st.dispatch_sent);
    add_split(sum.combine_sent, st.combine_sent);
    add_split(sum.row_payload, st.row_payload);
  }
  const size_t steps_per_pass = counted.size();
  for (double EpStepStats::*stage :
       {&EpStepStats::route_us, &EpStepStats::dispatch_us, &EpStepStats::experts_us,
        &EpStepStats::shared_us, &EpStepStats::combine_us, &EpStepStats::sum_us,
        &EpStepStats::total_us}) {
    std::vector<double> per_pass(timed.size() / steps_per_pass, 0.0);
    for (size_t i = 0; i < timed.size(); ++i) per_pass[i / steps_per_pass] += timed[i].*stage;
    sum.*stage = median(std::move(per_pass));
  }
  return sum;
}

}  // namespace

EpBenchGroup reduce_ep_bench(Communicator& comm, const Workload& w,
                             const std::vector<EpStepStats>& counted,
                             const std::vector<EpStepStats>& timed) {
  const size_t steps = w.steps.size();
  EpBenchGroup group;
  group.tokens_per_rank = w.tokens_per_rank;
  group.num_steps = static_cast<int64_t>(steps);
  group.num_tokens = w.num_tokens;
  group.passes = static_cast<int>(timed.size() / steps);
  group.ranks = gather_summaries(comm, summarize(pass_totals(counted, timed), comm));
  std::vector<double> totals;
  for (const EpStepStats& st : timed) totals.push_back(st.total_us);
  group.slowest_step_us.assign(totals.size(), 0.0);
  for (const std::vector<double>& rank_totals : all_gather_values(comm, totals)) {
    for (size_t i = 0; i < totals.size(); ++i) {
      group.slowest_step_us[i] = std::max(group.slowest_step_us[i], rank_totals[i]);
    }
  }
  return group;
}

}  // namespace moe::cli
