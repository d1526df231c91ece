#include "tools/moe/ep_bench_report.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

namespace moe::cli {

namespace {

double megabytes(double bytes) { return bytes * 1e-6; }

// A figure for the table, "-" where it was not measured.
std::string cell(double value, double scale, int decimals) {
  return measured(value) ? fmt::format("{:.{}f}", value * scale, decimals) : "-";
}

// Token rows that left their rank, and the seeds' bound on them, over all ranks.
std::pair<double, double> rows_out_and_bound(const EpBenchGroup& g) {
  double rows_out = 0, bound = 0;
  for (const EpRankSummary& r : g.ranks) {
    rows_out += r.rows_same_host + r.rows_cross_host;
    bound += r.upper_bound_bytes;
  }
  return {rows_out, bound};
}

}  // namespace

double EpBenchGroup::median_step_us() const {
  if (slowest_step_us.empty()) return 0;
  std::vector<double> sorted = slowest_step_us;
  std::sort(sorted.begin(), sorted.end());
  return sorted[sorted.size() / 2];
}

double EpBenchGroup::mean_load() const {
  double total = 0;
  for (const EpRankSummary& r : ranks) total += r.pairs_received;
  return ranks.empty() ? 0 : total / static_cast<double>(ranks.size());
}

double EpBenchGroup::max_load() const {
  double most = 0;
  for (const EpRankSummary& r : ranks) most = std::max(most, r.pairs_received);
  return most;
}

double EpBenchGroup::max_over_mean_load() const {
  const double mean = mean_load();
  return mean > 0 ? max_load() / mean : 0;
}

double EpBenchGroup::mean_slot_load() const {
  double pairs = 0, slots = 0;
  for (const EpRankSummary& r : ranks) {
    pairs += r.pairs_received;
    slots += r.num_slots;
  }
  return slots > 0 ? pairs / slots : 0;
}

double EpBenchGroup::max_slot_load() const {
  double most = 0;
  for (const EpRankSummary& r : ranks) most = std::max(most, r.max_slot_pairs);
  return most;
}

double EpBenchGroup::max_over_mean_slot_load() const {
  const double mean = mean_slot_load();
  return mean > 0 ? max_slot_load() / mean : 0;
}

void print_ep_bench_group(const EpBenchGroup& g) {
  const auto [rows_out, bound] = rows_out_and_bound(g);
  fmt::print("\n{}, {} steps, {} passes: step {:.3f} ms (median of the slowest rank per step)\n",
             g.tokens_per_rank >= 0 ? fmt::format("tokens/rank {}", g.tokens_per_rank)
                                    : fmt::format("trace: {} tokens", g.num_tokens),
             g.num_steps, g.passes, g.median_step_us() * 1e-3);
  fmt::print(
      "  load: max/mean {:.3f} over ranks (pairs served per pass: max {:.0f}, mean {:.1f}), "
      "{:.3f} over slots (max {:.0f}, mean {:.1f})\n",
      g.max_over_mean_load(), g.max_load(), g.mean_load(), g.max_over_mean_slot_load(),
      g.max_slot_load(), g.mean_slot_load());
  fmt::print(
      "  token rows to other ranks {:.3f} MB per pass, {:.0f}% of the T*k*H*b bound {:.3f} MB\n",
      megabytes(rows_out), bound > 0 ? 100.0 * rows_out / bound : 0.0, megabytes(bound));
  fmt::print("{:>4} {:>7} {:>5} {:>7} {:>6} | {:^15} | {:^15} | {:^15} | {:^9} | {:^34}\n", "rank",
             "load", "/mean", "local", "rows", "dispatch MB", "combine MB", "received MB",
             "per slot", "stage times per pass, ms");
  fmt::print(
      "{:>4} {:>7} {:>5} {:>7} {:>6} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>7} | {:>9} | {:>6} "
      "{:>6} {:>6} {:>6} {:>6}\n",
      "", "pairs", "", "pairs", "sent", "host", "cross", "host", "cross", "host", "cross",
      "min/max", "disp", "expert", "comb", "sum", "total");
  const double mean = g.mean_load();
  for (size_t rank = 0; rank < g.ranks.size(); ++rank) {
    const EpRankSummary& r = g.ranks[rank];
    fmt::print(
        "{:>4} {:>7.0f} {:>5.2f} {:>7} {:>6.0f} | {:>7.3f} {:>7.3f} | {:>7.3f} {:>7.3f} | {:>7.3f} "
        "{:>7.3f} | {:>9} | {:>6} {:>6} {:>6} {:>6} {:>6}\n",
        rank, r.pairs_received, mean > 0 ? r.pairs_received / mean : 0.0, cell(r.local_pairs, 1, 0),
        r.rows_sent, megabytes(r.dispatch_same_host), megabytes(r.dispatch_cross_host),
        megabytes(r.combine_same_host), megabytes(r.combine_cross_host),
        megabytes(r.received_same_host), megabytes(r.received_cross_host),
        fmt::format("{:.0f}/{:.0f}", r.min_slot_pairs, r.max_slot_pairs),
        cell(r.dispatch_us, 1e-3, 3), cell(r.experts_us, 1e-3, 3), cell(r.combine_us, 1e-3, 3),
        cell(r.sum_us, 1e-3, 3), cell(r.total_us, 1e-3, 3));
  }
}

nlohmann::json ep_bench_group_json(const EpBenchGroup& g) {
  const auto [rows_out, bound] = rows_out_and_bound(g);
  nlohmann::json loads = nlohmann::json::array(), ranks = nlohmann::json::array();
  double dispatch[3] = {0, 0, 0}, combine[3] = {0, 0, 0};  // self, same host, cross host
  for (const EpRankSummary& r : g.ranks) {
    loads.push_back(r.pairs_received);
    ranks.push_back(ep_rank_json(r));
    dispatch[0] += r.dispatch_self;
    dispatch[1] += r.dispatch_same_host;
    dispatch[2] += r.dispatch_cross_host;
    combine[0] += r.combine_self;
    combine[1] += r.combine_same_host;
    combine[2] += r.combine_cross_host;
  }
  return {{"tokens_per_rank",
           g.tokens_per_rank >= 0 ? nlohmann::json(g.tokens_per_rank) : nlohmann::json(nullptr)},
          {"steps", g.num_steps},
          {"tokens", g.num_tokens},
          {"passes", g.passes},
          {"step_ms", g.median_step_us() * 1e-3},
          {"load",
           {{"pairs_per_rank", loads},
            {"mean", g.mean_load()},
            {"max", g.max_load()},
            {"max_over_mean", g.max_over_mean_load()},
            {"slot_mean", g.mean_slot_load()},
            {"slot_max", g.max_slot_load()},
            {"slot_max_over_mean", g.max_over_mean_slot_load()}}},
          {"bytes_per_pass",
           {{"dispatch_self", dispatch[0]},
            {"dispatch_same_host", dispatch[1]},
            {"dispatch_cross_host", dispatch[2]},
            {"combine_self", combine[0]},
            {"combine_same_host", combine[1]},
            {"combine_cross_host", combine[2]},
            {"token_rows_to_other_ranks", rows_out},
            {"upper_bound", bound}}},
          {"ranks", ranks}};
}

}  // namespace moe::cli
