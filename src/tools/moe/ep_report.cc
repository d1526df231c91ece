#include "tools/moe/ep_report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "parallel/traffic.h"
#include "tools/moe/routing_ties.h"

namespace moe::cli {

namespace {

// The scalar fields of EpRankSummary in the order they travel.
constexpr double EpRankSummary::*kScalars[] = {
    &EpRankSummary::tokens,
    &EpRankSummary::pairs,
    &EpRankSummary::local_pairs,
    &EpRankSummary::rows_sent,
    &EpRankSummary::pairs_received,
    &EpRankSummary::upper_bound_bytes,
    &EpRankSummary::dispatch_self,
    &EpRankSummary::dispatch_same_host,
    &EpRankSummary::dispatch_cross_host,
    &EpRankSummary::combine_self,
    &EpRankSummary::combine_same_host,
    &EpRankSummary::combine_cross_host,
    &EpRankSummary::received_self,
    &EpRankSummary::received_same_host,
    &EpRankSummary::received_cross_host,
    &EpRankSummary::rows_self,
    &EpRankSummary::rows_same_host,
    &EpRankSummary::rows_cross_host,
    &EpRankSummary::min_slot_pairs,
    &EpRankSummary::max_slot_pairs,
    &EpRankSummary::num_slots,
    &EpRankSummary::route_us,
    &EpRankSummary::dispatch_us,
    &EpRankSummary::experts_us,
    &EpRankSummary::shared_us,
    &EpRankSummary::combine_us,
    &EpRankSummary::sum_us,
    &EpRankSummary::total_us,
};
constexpr size_t kNumScalars = std::size(kScalars);

double megabytes(double bytes) { return bytes * 1e-6; }
double milliseconds(double us) { return us * 1e-3; }

nlohmann::json value_json(double value) {
  return measured(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

}  // namespace

bool measured(double value) { return !std::isnan(value); }

double EpRankSummary::link_gb_per_s() const {
  const double bytes =
      dispatch_same_host + dispatch_cross_host + combine_same_host + combine_cross_host;
  const double seconds = (dispatch_us + combine_us) * 1e-6;
  if (!measured(seconds)) return kNotMeasured;
  return seconds > 0 ? bytes / seconds * 1e-9 : 0.0;
}

EpRankSummary summarize(const EpStepStats& s, const Communicator& comm) {
  EpRankSummary r;
  r.tokens = static_cast<double>(s.num_tokens);
  r.pairs = static_cast<double>(s.num_pairs);
  r.local_pairs = static_cast<double>(s.local_pairs);
  r.rows_sent = static_cast<double>(s.rows_sent);
  r.pairs_received = static_cast<double>(s.pairs_received);
  r.upper_bound_bytes = static_cast<double>(s.upper_bound_bytes);
  r.dispatch_self = static_cast<double>(s.dispatch_sent.self);
  r.dispatch_same_host = static_cast<double>(s.dispatch_sent.same_host);
  r.dispatch_cross_host = static_cast<double>(s.dispatch_sent.cross_host);
  r.combine_self = static_cast<double>(s.combine_sent.self);
  r.combine_same_host = static_cast<double>(s.combine_sent.same_host);
  r.combine_cross_host = static_cast<double>(s.combine_sent.cross_host);
  std::vector<int64_t> received = s.dispatch_bytes_received;
  for (size_t p = 0; p < received.size() && p < s.combine_bytes_received.size(); ++p) {
    received[p] += s.combine_bytes_received[p];
  }
  const TrafficSplit from = parallel::split_by_domain(received, comm);
  r.received_self = static_cast<double>(from.self);
  r.received_same_host = static_cast<double>(from.same_host);
  r.received_cross_host = static_cast<double>(from.cross_host);
  r.rows_self = static_cast<double>(s.row_payload.self);
  r.rows_same_host = static_cast<double>(s.row_payload.same_host);
  r.rows_cross_host = static_cast<double>(s.row_payload.cross_host);
  const SlotLoad slots = slot_load(s.pairs_per_local_slot);
  r.min_slot_pairs = slots.min;
  r.max_slot_pairs = slots.max;
  r.num_slots = static_cast<double>(s.pairs_per_local_slot.size());
  r.route_us = s.route_us;
  r.dispatch_us = s.dispatch_us;
  r.experts_us = s.experts_us;
  r.shared_us = s.shared_us;
  r.combine_us = s.combine_us;
  r.sum_us = s.sum_us;
  r.total_us = s.total_us;
  r.dispatch_sent.assign(s.dispatch_bytes_sent.begin(), s.dispatch_bytes_sent.end());
  r.combine_sent.assign(s.combine_bytes_sent.begin(), s.combine_bytes_sent.end());
  return r;
}

std::vector<std::vector<double>> all_gather_values(Communicator& comm,
                                                   const std::vector<double>& mine) {
  const size_t N = static_cast<size_t>(comm.size()), width = mine.size();
  std::vector<double> all(N * width);
  comm.all_gather(mine.data(), static_cast<int64_t>(width * sizeof(double)), all.data());
  std::vector<std::vector<double>> ranks(N);
  for (size_t r = 0; r < N; ++r)
    ranks[r].assign(all.begin() + r * width, all.begin() + (r + 1) * width);
  return ranks;
}

std::vector<EpRankSummary> gather_summaries(Communicator& comm, const EpRankSummary& mine) {
  const size_t N = static_cast<size_t>(comm.size()), width = kNumScalars + 2 * N;
  std::vector<double> packed;
  for (auto field : kScalars) packed.push_back(mine.*field);
  packed.insert(packed.end(), mine.dispatch_sent.begin(), mine.dispatch_sent.end());
  packed.insert(packed.end(), mine.combine_sent.begin(), mine.combine_sent.end());
  const std::vector<std::vector<double>> all = all_gather_values(comm, packed);
  std::vector<EpRankSummary> ranks(N);
  for (size_t r = 0; r < N; ++r) {
    const double* row = all[r].data();
    for (size_t i = 0; i < kNumScalars; ++i) ranks[r].*kScalars[i] = row[i];
    ranks[r].dispatch_sent.assign(row + kNumScalars, row + kNumScalars + N);
    ranks[r].combine_sent.assign(row + kNumScalars + N, row + width);
  }
  return ranks;
}

void print_ep_batch(int64_t tokens_per_rank, const std::vector<EpRankSummary>& ranks,
                    const EpCheck& check) {
  double slowest = 0, rows_out = 0, bound = 0;
  for (const EpRankSummary& r : ranks) {
    slowest = std::max(slowest, r.total_us);
    rows_out += r.rows_same_host + r.rows_cross_host;
    bound += r.upper_bound_bytes;
  }
  fmt::print(
      "\ntokens/rank {}: step {:.3f} ms (slowest rank); token rows to other ranks {:.3f} MB, "
      "{:.0f}% of the T*k*H*b bound {:.3f} MB\n",
      tokens_per_rank, milliseconds(slowest), megabytes(rows_out),
      bound > 0 ? 100.0 * rows_out / bound : 0.0, megabytes(bound));
  fmt::print("{:>4} {:>6} {:>6} {:>6} | {:^15} | {:^15} | {:>7} {:^9} | {:^47} | {:>6}\n", "rank",
             "pairs", "local", "rows", "dispatch MB", "combine MB", "pairs", "per slot",
             "stage times, ms", "GB/s");
  fmt::print(
      "{:>4} {:>6} {:>6} {:>6} | {:>7} {:>7} | {:>7} {:>7} | {:>7} {:>9} | {:>6} {:>6} "
      "{:>6} {:>6} {:>6} {:>6} {:>6} | {:>6}\n",
      "", "", "", "sent", "host", "cross", "host", "cross", "in", "min/max", "route", "disp",
      "expert", "shared", "comb", "sum", "total", "links");
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    const EpRankSummary& r = ranks[rank];
    fmt::print(
        "{:>4} {:>6.0f} {:>6.0f} {:>6.0f} | {:>7.3f} {:>7.3f} | {:>7.3f} {:>7.3f} | {:>7.0f} "
        "{:>9} | {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} {:>6.3f} | {:>6.2f}\n",
        rank, r.pairs, r.local_pairs, r.rows_sent, megabytes(r.dispatch_same_host),
        megabytes(r.dispatch_cross_host), megabytes(r.combine_same_host),
        megabytes(r.combine_cross_host), r.pairs_received,
        fmt::format("{:.0f}/{:.0f}", r.min_slot_pairs, r.max_slot_pairs), milliseconds(r.route_us),
        milliseconds(r.dispatch_us), milliseconds(r.experts_us), milliseconds(r.shared_us),
        milliseconds(r.combine_us), milliseconds(r.sum_us), milliseconds(r.total_us),
        r.link_gb_per_s());
  }
  if (check.checked_tokens > 0) {
    const std::string note = routing_note(check.routing_mismatches, check.routed_at_ties);
    fmt::print(
        "check: {} sampled tokens: {} the single-process layer; max rel error {:.2e} against the "
        "float64 reference (bound {:.0e}){}\n",
        check.checked_tokens,
        check.differing_elements == 0
            ? "bitwise equal to"
            : fmt::format("{} elements DIFFER from", check.differing_elements),
        check.max_rel_error, check.error_bound, note.empty() ? "" : "; " + note);
  }
}

nlohmann::json ep_setup_json(const MoeConfig& config, const Communicator& comm,
                             const EpSettings& settings, const ExpertMap& map) {
  return {{"model", config.name},
          {"ranks", comm.size()},
          {"hosts", comm.num_hosts()},
          {"communicator", comm.name()},
          {"dispatcher", settings.dispatcher},
          {"two_batch_overlap", settings.overlap},
          {"over_nccl", settings.over_nccl},
          {"placement", settings.placement.empty() ? "contiguous" : settings.placement},
          {"num_slots", map.num_slots()},
          {"hidden_size", config.experts.hidden_size},
          {"top_k", config.routing.top_k}};
}

void print_ep_setup(const EpSettings& settings, const ExpertMap& map) {
  fmt::print("  dispatch   {} ({}{}), two-batch overlap {}\n", settings.dispatcher,
             settings.dispatcher == "ht" ? "high-throughput" : "low-latency",
             settings.over_nccl ? ", over NCCL" : "", settings.overlap ? "on" : "off");
  fmt::print("  placement  {}: {} slots for {} experts\n",
             settings.placement.empty() ? "contiguous" : settings.placement, map.num_slots(),
             map.num_experts());
}

void print_ep_gpu_shape(const MoeConfig& config) {
  const ExpertsConfig& x = config.experts;
  fmt::print("  shape      H={} I={} E={} k={}{}\n", x.hidden_size, x.intermediate_size,
             config.routing.num_experts, config.routing.top_k,
             x.shared_intermediate_size > 0
                 ? fmt::format(" shared I={}{}, on every rank for its own tokens",
                               x.shared_intermediate_size, x.shared_gate ? " (gated)" : "")
                 : "");
}

nlohmann::json ep_rank_json(const EpRankSummary& r) {
  return {
      {"tokens", r.tokens},
      {"pairs", r.pairs},
      {"local_pairs", value_json(r.local_pairs)},
      {"rows_sent", r.rows_sent},
      {"row_payload_bytes",
       {{"self", r.rows_self}, {"same_host", r.rows_same_host}, {"cross_host", r.rows_cross_host}}},
      {"upper_bound_bytes", r.upper_bound_bytes},
      {"dispatch_bytes_sent",
       {{"self", r.dispatch_self},
        {"same_host", r.dispatch_same_host},
        {"cross_host", r.dispatch_cross_host},
        {"per_peer", r.dispatch_sent}}},
      {"combine_bytes_sent",
       {{"self", r.combine_self},
        {"same_host", r.combine_same_host},
        {"cross_host", r.combine_cross_host},
        {"per_peer", r.combine_sent}}},
      {"bytes_received",
       {{"self", r.received_self},
        {"same_host", r.received_same_host},
        {"cross_host", r.received_cross_host}}},
      {"pairs_received", r.pairs_received},
      {"pairs_per_local_slot", {{"min", r.min_slot_pairs}, {"max", r.max_slot_pairs}}},
      {"stages_us",
       {{"route", value_json(r.route_us)},
        {"dispatch", value_json(r.dispatch_us)},
        {"experts", value_json(r.experts_us)},
        {"shared", value_json(r.shared_us)},
        {"combine", value_json(r.combine_us)},
        {"sum", value_json(r.sum_us)},
        {"total", r.total_us}}},
      {"link_gb_per_s", value_json(r.link_gb_per_s())}};
}

nlohmann::json ep_batch_json(int64_t tokens_per_rank, const std::vector<EpRankSummary>& ranks,
                             const EpCheck& check) {
  nlohmann::json per_rank = nlohmann::json::array();
  for (const EpRankSummary& r : ranks) per_rank.push_back(ep_rank_json(r));
  return {{"tokens_per_rank", tokens_per_rank},
          {"ranks", per_rank},
          {"check",
           {{"tokens", check.checked_tokens},
            {"differing_elements", check.differing_elements},
            {"bitwise_equal", check.differing_elements == 0},
            {"routing_mismatches", check.routing_mismatches},
            {"routed_at_ties", check.routed_at_ties},
            {"max_rel_error", check.max_rel_error},
            {"error_bound", check.error_bound}}}};
}

}  // namespace moe::cli
