// What `moe run --ep --device cuda` reports: each rank's CudaEpLayer counters of one step,
// gathered on rank 0 and printed as a table (or JSON) next to the seeds' upper bound T*k*H*b on
// the dispatched payload; and its check, which holds the expert-parallel output to the single-GPU
// layer's within bf16 rounding (the GPU layer is not bitwise equal to it: docs/parallel-cuda.md).
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "moe/communicator.h"
#include "moe/cuda_ep_layer.h"
#include "moe/tensor.h"

namespace moe::cli {

// One rank's counters of one step, in a form that travels as doubles. Bytes per peer count a
// token row out with its k slot ids and weights, and a partial row back (CudaEpStats).
struct CudaEpRankSummary {
  double rank = 0;
  double tokens = 0;
  double upper_bound_bytes = 0;     // T*k*H*b of this rank's tokens, b = 2 (bf16)
  double row_payload_to_peers = 0;  // H*b per token row sent to another rank
  double sent_self = 0, sent_same_host = 0, sent_cross_host = 0;
  double received_self = 0, received_same_host = 0, received_cross_host = 0;
  double two_batch = 0;  // 1: a two-batch step, whose stages overlap and are not timed apart
  // Pairs this rank's experts ran, and per local slot (CudaEpStats::pairs_per_local_slot).
  double pairs_served = 0, min_slot_pairs = 0, mean_slot_pairs = 0, max_slot_pairs = 0;
  double route_us = 0, dispatch_us = 0, experts_us = 0, combine_us = 0, shared_us = 0, total_us = 0;
  std::vector<double> rows_sent, rows_received, bytes_sent, bytes_received;  // [N]

  double rows_to_peers() const;  // token rows sent to the other ranks
  double rows_served() const;    // token rows this rank's experts ran on, its own too
  // Bytes sent to other ranks over the time of dispatch and combine; 0 in a two-batch step.
  double link_gb_per_s() const;
};

CudaEpRankSummary summarize(const CudaEpStats& stats, int64_t top_k, int64_t hidden_size, int rank,
                            bool two_batch);

// Every rank's summary, on every rank (a collective).
std::vector<CudaEpRankSummary> gather_summaries(Communicator& comm, const CudaEpRankSummary& mine);

// The sampled tokens' agreement with the single-GPU CUDA layer (the same weights and tokens) and
// with the float64 reference.
struct CudaEpCheck {
  int64_t checked_tokens = 0;
  // Single-GPU layer: each token's row within `roundings` * 2^-8 of its largest element there.
  double roundings = 0;  // k + N + 1, and one more with shared experts
  int64_t tokens_beyond_bound = 0;
  double worst_fraction_of_bound = 0;          // max |ep - single| / tolerance over the elements
  int64_t worst_token = 0, worst_element = 0;  // among the sampled tokens, in rank order
  double worst_got = 0, worst_want = 0, worst_tolerance = 0;
  // Float64 reference, as `moe run` checks every backend.
  // Tokens whose experts differ from the reference's beyond a tie of logits, and at one
  // (tools/moe/routing_ties.h: checked on the layer's own routing).
  int64_t routing_mismatches = 0;
  int64_t routed_at_ties = 0;
  double max_rel_error = 0;
  double error_bound = 0;

  bool passed() const;
};

// Compares got with want ([T, H], any float dtype): each token's row must lie within
// (top_k + num_ranks + 1) bf16 roundings (2^-8 each) of its largest |want| element, one more
// with shared experts (both layers round the routed sum before adding them), the bound
// tests/parallel/cuda/cuda_ep_test.cc holds CudaEpLayer to. Fills the single-GPU fields.
void compare_within_bf16_rounding(const Tensor& got, const Tensor& want, int64_t top_k,
                                  int num_ranks, bool shared_experts, CudaEpCheck& check);

void print_cuda_ep_batch(int64_t tokens_per_rank, const std::vector<CudaEpRankSummary>& ranks,
                         const CudaEpCheck& check);
nlohmann::json cuda_ep_batch_json(int64_t tokens_per_rank,
                                  const std::vector<CudaEpRankSummary>& ranks,
                                  const CudaEpCheck& check);

}  // namespace moe::cli
