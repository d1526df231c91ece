// EpMoeLayer: one MoE layer run with expert parallelism over a Communicator. Every rank holds the
// router, the shared experts and the weights of its own expert slots (moe/expert_map.h), routes
// its own tokens and sends each (token, expert) pair to the rank that holds the expert:
//
//   route     every rank routes its own tokens (topk ids and weights, as MoeLayer does)
//   dispatch  each pair gets a slot: a replica of its expert on this rank if any, else on this
//             host, else any; among several candidates the expert's n-th pair of the call takes
//             candidate (n + rank) mod count. Each token row goes once to each rank that serves
//             one of its pairs, with one record per pair {token, j, source rank, slot, row,
//             router weight}, records grouped by slot.
//   experts   each rank runs gemm1, act, gemm2 (router weight applied) on the pairs it received,
//             reading the received rows in place; the blocks of other ranks' slots are skipped
//             through the kernels' expert_map.
//   combine   the result of every pair goes back to its source rank (bf16 for a bf16 layer, else
//             f32: the row the single-process layer's sum reads), which sums each token's k
//             results in ascending j (then the shared experts, computed locally) exactly as the
//             single-process layer does: for f32, bf16 and f16 alike the output is bitwise the
//             same as MoeLayer's for the same weights and tokens.
//
// Two dispatchers, after DeepEP's two modes:
//   high-throughput  (prefill) one all-to-all of per-peer counts, then all-to-alls of the records
//                    and the rows, sized exactly; buffers grow to the largest batch seen.
//   low-latency      (decode) no count exchange: each peer's message lands in a fixed slot of
//                    buffers allocated once for `low_latency_capacity` rows per source rank
//                    (a masked layout the experts read in place). A rank that would send more
//                    rows to a peer than that fails the step on every rank with a moe::Error
//                    giving the counts; nothing is dropped.
// Two-batch overlap splits the tokens into two micro-batches so one's dispatch and combine are
// in flight while the other's experts run (through the communicator's non-blocking operations).
//
// Every rank must call forward() for every step, also with zero tokens: the collectives need all
// ranks. docs/parallel.md has the design, the fault model and measured figures.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/communicator.h"
#include "moe/config.h"
#include "moe/cpu_isa.h"
#include "moe/expert_map.h"
#include "moe/layer.h"
#include "moe/tensor.h"

namespace moe {

enum class DispatcherKind : uint8_t { kHighThroughput, kLowLatency };

const char* dispatcher_name(DispatcherKind kind);          // "ht" | "ll"
DispatcherKind parse_dispatcher(const std::string& name);  // throws moe::Error on others

struct EpOptions {
  DispatcherKind dispatcher = DispatcherKind::kHighThroughput;
  // Low-latency: the most token rows one rank sends another per micro-batch. A rank never needs
  // more than its number of tokens (per micro-batch), so that many never overflows.
  int64_t low_latency_capacity = 128;
  bool two_batch_overlap = false;
  int num_threads = 0;             // 0 = all hardware threads
  int64_t block_m = 0;             // 0 = the cpu backend's choice
  CpuIsa cpu_isa = CpuIsa::kAuto;  // kAuto = MOE_CPU_ISA, or the fastest path (moe/cpu_isa.h)
};

// Bytes by where they go, from this rank's point of view.
struct TrafficSplit {
  int64_t self = 0;        // for this rank itself: read in place, never copied
  int64_t same_host = 0;   // to another rank of this host
  int64_t cross_host = 0;  // to a rank of another host
};

// What one forward did on this rank. Per-peer arrays are [num_ranks] and count every byte of
// every message (counts, headers, records, rows, results); a rank sends itself nothing: its own
// pairs are served in place.
struct EpStepStats {
  int64_t num_tokens = 0;         // this rank's tokens
  int64_t num_pairs = 0;          // num_tokens * k
  int64_t rows_sent = 0;          // token rows sent to other ranks: one per (token, rank)
  int64_t local_pairs = 0;        // pairs served by this rank's own experts, nothing copied
  int64_t pairs_received = 0;     // pairs this rank's experts computed, its own included
  int64_t upper_bound_bytes = 0;  // the seeds' T*k*H*b for this rank's tokens
  std::vector<int64_t> dispatch_bytes_sent, dispatch_bytes_received;
  std::vector<int64_t> combine_bytes_sent, combine_bytes_received;
  TrafficSplit dispatch_sent, combine_sent;  // the per-peer sends, by domain
  // Token-row payload (H values per token and serving rank) by domain, to hold against T*k*H*b;
  // self is the rows that stay.
  TrafficSplit row_payload;
  std::vector<int32_t> pairs_per_local_slot;  // [num local slots]
  // Wall time each stage held this rank, in microseconds. With two-batch overlap, dispatch and
  // combine count only the time spent waiting for them (what overlap did not hide).
  double route_us = 0, dispatch_us = 0, experts_us = 0, shared_us = 0, combine_us = 0, sum_us = 0,
         total_us = 0;
};

// `full`'s router, biases and shared experts, with w13 and w2 (and their biases) cut to the
// slots `rank` holds, in its local slot order: what one rank of an EP group loads.
LayerWeights local_layer_weights(const LayerWeights& full, const ExpertMap& map, int rank);

class EpMoeLayer {
 public:
  // local_weights: router [E, H] (and its biases) and the shared experts whole; w13 [L, 2I, H],
  // w2 [L, H, I] and their biases for this rank's L = map.local_slots(comm.rank()).size() slots.
  // Throws moe::Error on a mismatch with the config, the map or the communicator (whose rank
  // count must equal the map's), a communicator on device buffers, or a cpu_isa this machine
  // cannot run. The expert weights are packed once, as MoeLayer packs them, and only the packed
  // copy stays. `comm` must outlive the layer.
  EpMoeLayer(MoeConfig config, LayerWeights local_weights, ExpertMap map, Communicator& comm,
             EpOptions options = {});
  ~EpMoeLayer();
  EpMoeLayer(EpMoeLayer&&) noexcept;
  EpMoeLayer& operator=(EpMoeLayer&&) noexcept;

  // hidden [M, H] f32/bf16/f16 on the CPU (M may be 0) -> out [M, H] of the same dtype. A
  // collective: every rank calls it once per step. Throws moe::Error on bad input (before any
  // communication, so the peers then time out) and on communication failures.
  void forward(const TensorView& hidden, const TensorView& out);
  Tensor forward(const TensorView& hidden);
  // The same on a routing the caller chose (a recorded trace, a benchmark), as CudaEpLayer's
  // forward_routed: the router is skipped and route_us stays 0. topk_ids [M, k] int32 in [0, E)
  // (logical experts; unlike the GPU layer there is no -1 "no expert" id) and topk_weights [M, k]
  // f32, both on the CPU. With the ids and weights forward() chose (last_topk_ids/weights) the
  // output is bitwise forward()'s. Every id is checked before any communication: a bad one
  // throws moe::Error naming the token, its slot j and the id, and no output is written.
  void forward_routed(const TensorView& hidden, const TensorView& topk_ids,
                      const TensorView& topk_weights, const TensorView& out);

  const MoeConfig& config() const { return config_; }
  const ExpertMap& expert_map() const;
  Communicator& communicator() const;
  const EpOptions& options() const { return options_; }
  const EpStepStats& last_stats() const;
  TensorView last_topk_ids() const;      // [M, k] int32 (logical experts), routed or given
  TensorView last_topk_weights() const;  // [M, k] f32

 private:
  struct State;
  void reset_stats(int64_t num_tokens, DType dtype);
  // Dispatch, experts, combine and sum of the routing in state_'s topk_ids and topk_weights.
  void run_routed(const TensorView& hidden, const TensorView& out);

  MoeConfig config_;
  EpOptions options_;
  std::unique_ptr<State> state_;
};

}  // namespace moe
