#include "tools/moe/ep_report_cuda.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include <fmt/format.h>

#include "tools/moe/ep_report.h"
#include "tools/moe/routing_ties.h"

namespace moe::cli {

namespace {

// The scalar fields of CudaEpRankSummary in the order they travel.
constexpr double CudaEpRankSummary::*kScalars[] = {
    &CudaEpRankSummary::rank,
    &CudaEpRankSummary::tokens,
    &CudaEpRankSummary::upper_bound_bytes,
    &CudaEpRankSummary::row_payload_to_peers,
    &CudaEpRankSummary::sent_self,
    &CudaEpRankSummary::sent_same_host,
    &CudaEpRankSummary::sent_cross_host,
    &CudaEpRankSummary::received_self,
    &CudaEpRankSummary::received_same_host,
    &CudaEpRankSummary::received_cross_host,
    &CudaEpRankSummary::two_batch,
    &CudaEpRankSummary::pairs_served,
    &CudaEpRankSummary::min_slot_pairs,
    &CudaEpRankSummary::mean_slot_pairs,
    &CudaEpRankSummary::max_slot_pairs,
    &CudaEpRankSummary::route_us,
    &CudaEpRankSummary::dispatch_us,
    &CudaEpRankSummary::experts_us,
    &CudaEpRankSummary::combine_us,
    &CudaEpRankSummary::shared_us,
    &CudaEpRankSummary::total_us,
};
constexpr size_t kNumScalars = std::size(kScalars);
// The per-peer arrays in the order they travel.
constexpr std::vector<double> CudaEpRankSummary::*kPerPeer[] = {
    &CudaEpRankSummary::rows_sent,
    &CudaEpRankSummary::rows_received,
    &CudaEpRankSummary::bytes_sent,
    &CudaEpRankSummary::bytes_received,
};

double megabytes(double bytes) { return bytes * 1e-6; }

double sum(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

std::vector<double> as_doubles(const std::vector<int64_t>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// A stage time in ms, or "-" where a two-batch step did not time it apart.
std::string stage_ms(const CudaEpRankSummary& r, double us) {
  return r.two_batch != 0 ? "-" : fmt::format("{:.3f}", us * 1e-3);
}

nlohmann::json stage_json(const CudaEpRankSummary& r, double us) {
  return r.two_batch != 0 ? nlohmann::json(nullptr) : nlohmann::json(us);
}

}  // namespace

double CudaEpRankSummary::rows_to_peers() const {
  return sum(rows_sent) - rows_sent[static_cast<size_t>(rank)];
}

double CudaEpRankSummary::rows_served() const { return sum(rows_received); }

double CudaEpRankSummary::link_gb_per_s() const {
  const double seconds = (dispatch_us + combine_us) * 1e-6;
  return two_batch == 0 && seconds > 0 ? (sent_same_host + sent_cross_host) / seconds * 1e-9 : 0.0;
}

CudaEpRankSummary summarize(const CudaEpStats& s, int64_t top_k, int64_t hidden_size, int rank,
                            bool two_batch) {
  constexpr double kBytesPerValue = 2;  // bf16 rows
  CudaEpRankSummary r;
  r.rank = rank;
  r.tokens = static_cast<double>(s.num_tokens);
  r.upper_bound_bytes = r.tokens * static_cast<double>(top_k * hidden_size) * kBytesPerValue;
  r.rows_sent = as_doubles(s.rows_sent);
  r.rows_received = as_doubles(s.rows_received);
  r.bytes_sent = as_doubles(s.bytes_sent);
  r.bytes_received = as_doubles(s.bytes_received);
  r.row_payload_to_peers = r.rows_to_peers() * static_cast<double>(hidden_size) * kBytesPerValue;
  r.sent_self = static_cast<double>(s.sent.self);
  r.sent_same_host = static_cast<double>(s.sent.same_host);
  r.sent_cross_host = static_cast<double>(s.sent.cross_host);
  r.received_self = static_cast<double>(s.received.self);
  r.received_same_host = static_cast<double>(s.received.same_host);
  r.received_cross_host = static_cast<double>(s.received.cross_host);
  r.two_batch = two_batch ? 1 : 0;
  const SlotLoad slots = slot_load(s.pairs_per_local_slot);
  r.pairs_served = slots.total;
  r.min_slot_pairs = slots.min;
  r.max_slot_pairs = slots.max;
  if (!s.pairs_per_local_slot.empty()) {
    r.mean_slot_pairs = slots.total / static_cast<double>(s.pairs_per_local_slot.size());
  }
  r.route_us = s.route_us;
  r.dispatch_us = s.dispatch_us;
  r.experts_us = s.experts_us;
  r.combine_us = s.combine_us;
  r.shared_us = s.shared_us;
  r.total_us = s.total_us;
  return r;
}

std::vector<CudaEpRankSummary> gather_summaries(Communicator& comm, const CudaEpRankSummary& mine) {
  const size_t N = static_cast<size_t>(comm.size());
  std::vector<double> packed;
  for (auto field : kScalars) packed.push_back(mine.*field);
  for (auto array : kPerPeer)
    packed.insert(packed.end(), (mine.*array).begin(), (mine.*array).end());
  const std::vector<std::vector<double>> all = all_gather_values(comm, packed);
  std::vector<CudaEpRankSummary> ranks(N);
  for (size_t r = 0; r < N; ++r) {
    const double* row = all[r].data();
    for (size_t i = 0; i < kNumScalars; ++i) ranks[r].*kScalars[i] = row[i];
    const double* peers = row + kNumScalars;
    for (auto array : kPerPeer) {
      (ranks[r].*array).assign(peers, peers + N);
      peers += N;
    }
  }
  return ranks;
}

bool CudaEpCheck::passed() const {
  return tokens_beyond_bound == 0 && routing_mismatches == 0 && max_rel_error <= error_bound;
}

void compare_within_bf16_rounding(const Tensor& got, const Tensor& want, int64_t top_k,
                                  int num_ranks, bool shared_experts, CudaEpCheck& check) {
  const Tensor g = Tensor::copy_of(got, DType::kF32), w = Tensor::copy_of(want, DType::kF32);
  const int64_t T = want.size(0), H = want.size(1);
  const double rounding = std::ldexp(1.0, -8);
  check.checked_tokens = T;
  check.roundings = static_cast<double>(top_k + num_ranks + 1 + (shared_experts ? 1 : 0));
  for (int64_t t = 0; t < T; ++t) {
    const float* a = g.data<float>() + t * H;
    const float* b = w.data<float>() + t * H;
    double scale = 1e-6;
    for (int64_t h = 0; h < H; ++h) scale = std::max(scale, std::fabs(double{b[h]}));
    const double tolerance = check.roundings * rounding * scale;
    bool beyond = false;
    for (int64_t h = 0; h < H; ++h) {
      const double error = std::fabs(double{a[h]} - double{b[h]});
      // A NaN or infinity in the output is beyond any bound.
      const double fraction = std::isfinite(error) ? error / tolerance : INFINITY;
      beyond = beyond || fraction > 1.0;
      if (fraction > check.worst_fraction_of_bound) {
        check.worst_fraction_of_bound = fraction;
        check.worst_token = t;
        check.worst_element = h;
        check.worst_got = a[h];
        check.worst_want = b[h];
        check.worst_tolerance = tolerance;
      }
    }
    check.tokens_beyond_bound += beyond;
  }
}

void print_cuda_ep_batch(int64_t tokens_per_rank, const std::vector<CudaEpRankSummary>& ranks,
                         const CudaEpCheck& check) {
  double slowest = 0, payload = 0, bound = 0;
  for (const CudaEpRankSummary& r : ranks) {
    slowest = std::max(slowest, r.total_us);
    payload += r.row_payload_to_peers;
    bound += r.upper_bound_bytes;
  }
  fmt::print(
      "\ntokens/rank {}: step {:.3f} ms (slowest rank); token rows to other ranks {:.3f} MB, "
      "{:.0f}% of the T*k*H*b bound {:.3f} MB\n",
      tokens_per_rank, slowest * 1e-3, megabytes(payload),
      bound > 0 ? 100.0 * payload / bound : 0.0, megabytes(bound));
  fmt::print("{:>4} {:>6} {:>6} | {:^25} | {:^23} | {:^23} | {:^41} | {:>6}\n", "rank", "rows",
             "rows", "pairs", "sent MB", "received MB", "stage times, ms", "GB/s");
  fmt::print(
      "{:>4} {:>6} {:>6} | {:>7} {:>17} | {:>7} {:>7} {:>7} | {:>7} {:>7} {:>7} | {:>6} {:>6} "
      "{:>6} {:>6} {:>6} {:>6} | {:>6}\n",
      "", "out", "served", "served", "slot min/mean/max", "self", "host", "cross", "self", "host",
      "cross", "route", "disp", "expert", "comb", "shared", "total", "links");
  for (const CudaEpRankSummary& r : ranks) {
    fmt::print(
        "{:>4.0f} {:>6.0f} {:>6.0f} | {:>7.0f} {:>17} | {:>7.3f} {:>7.3f} {:>7.3f} | {:>7.3f} "
        "{:>7.3f} {:>7.3f} | {:>6.3f} {:>6} {:>6} {:>6} {:>6} {:>6.3f} | {:>6}\n",
        r.rank, r.rows_to_peers(), r.rows_served(), r.pairs_served,
        fmt::format("{:.0f}/{:.1f}/{:.0f}", r.min_slot_pairs, r.mean_slot_pairs, r.max_slot_pairs),
        megabytes(r.sent_self), megabytes(r.sent_same_host), megabytes(r.sent_cross_host),
        megabytes(r.received_self), megabytes(r.received_same_host),
        megabytes(r.received_cross_host), r.route_us * 1e-3, stage_ms(r, r.dispatch_us),
        stage_ms(r, r.experts_us), stage_ms(r, r.combine_us), stage_ms(r, r.shared_us),
        r.total_us * 1e-3, r.two_batch != 0 ? "-" : fmt::format("{:.2f}", r.link_gb_per_s()));
  }
  if (!ranks.empty() && ranks[0].two_batch != 0) {
    fmt::print(
        "(two-batch steps: dispatch, experts, combine and shared overlap and are not timed "
        "apart)\n");
  }
  if (check.checked_tokens == 0) return;
  const std::string single =
      check.tokens_beyond_bound == 0
          ? fmt::format("within bf16 rounding of the single-GPU layer (worst {:.2f} of the bound)",
                        check.worst_fraction_of_bound)
          : fmt::format(
                "{} tokens EXCEED the bf16 bound against the single-GPU layer (worst: sampled "
                "token {} element {}: got {}, single GPU {}, tolerance {:.3e})",
                check.tokens_beyond_bound, check.worst_token, check.worst_element, check.worst_got,
                check.worst_want, check.worst_tolerance);
  const std::string note = routing_note(check.routing_mismatches, check.routed_at_ties);
  fmt::print(
      "check: {} sampled tokens: {}; max rel error {:.2e} against the float64 reference (bound "
      "{:.0e}){}\n",
      check.checked_tokens, single, check.max_rel_error, check.error_bound,
      note.empty() ? "" : "; " + note);
}

nlohmann::json cuda_ep_batch_json(int64_t tokens_per_rank,
                                  const std::vector<CudaEpRankSummary>& ranks,
                                  const CudaEpCheck& check) {
  nlohmann::json per_rank = nlohmann::json::array();
  for (const CudaEpRankSummary& r : ranks) {
    per_rank.push_back({{"tokens", r.tokens},
                        {"rows_sent", r.rows_sent},
                        {"rows_received", r.rows_received},
                        {"row_payload_bytes_to_peers", r.row_payload_to_peers},
                        {"upper_bound_bytes", r.upper_bound_bytes},
                        {"bytes_sent",
                         {{"self", r.sent_self},
                          {"same_host", r.sent_same_host},
                          {"cross_host", r.sent_cross_host},
                          {"per_peer", r.bytes_sent}}},
                        {"bytes_received",
                         {{"self", r.received_self},
                          {"same_host", r.received_same_host},
                          {"cross_host", r.received_cross_host},
                          {"per_peer", r.bytes_received}}},
                        {"stages_us",
                         {{"route", r.route_us},
                          {"dispatch", stage_json(r, r.dispatch_us)},
                          {"experts", stage_json(r, r.experts_us)},
                          {"combine", stage_json(r, r.combine_us)},
                          {"shared", stage_json(r, r.shared_us)},
                          {"total", r.total_us}}},
                        {"link_gb_per_s", r.two_batch != 0 ? nlohmann::json(nullptr)
                                                           : nlohmann::json(r.link_gb_per_s())}});
    per_rank.back()["pairs_served"] = r.pairs_served;
    per_rank.back()["pairs_per_local_slot"] = {
        {"min", r.min_slot_pairs}, {"mean", r.mean_slot_pairs}, {"max", r.max_slot_pairs}};
  }
  return {{"tokens_per_rank", tokens_per_rank},
          {"ranks", per_rank},
          {"check",
           {{"tokens", check.checked_tokens},
            {"against_single_gpu",
             {{"bound", fmt::format("{} * 2^-8 of each token's largest output (bf16 rounding, "
                                    "not bitwise)",
                                    check.roundings)},
              {"tokens_beyond_bound", check.tokens_beyond_bound},
              {"worst_fraction_of_bound", check.worst_fraction_of_bound}}},
            {"within_bf16_rounding", check.tokens_beyond_bound == 0},
            {"routing_mismatches", check.routing_mismatches},
            {"routed_at_ties", check.routed_at_ties},
            {"max_rel_error", check.max_rel_error},
            {"error_bound", check.error_bound},
            {"passed", check.passed()}}}};
}

}  // namespace moe::cli
