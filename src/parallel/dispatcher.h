// Dispatch and combine of one micro-batch, over host buffers and any Communicator. The base class
// holds what both dispatchers share: the plan, the packing of the rows, the checks and the index
// of what arrived, and combine (whose sizes both sides already know, so it is one exact
// all-to-all of the experts' result rows, in cache3's dtype: bf16 for a bf16 layer, else f32). The
// two subclasses differ in how the rows and records travel: high_throughput_dispatcher.h (a count
// exchange, then exact sizes) and low_latency_dispatcher.h (fixed slots, no count exchange).
//
// A rank's pairs for its own experts never travel: its experts read those rows in place in the
// batch, and its sum reads their results in place in the experts' output (as DeepEP keeps local
// tokens off the network). Only rows and results for other ranks go through the communicator.
//
// Use, per micro-batch and in the same order on every rank:
//   start_dispatch -> finish_dispatch -> (experts) -> start_combine -> finish_combine
// Two Dispatchers may be in flight at once (two-batch overlap); each owns its buffers.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "moe/communicator.h"
#include "moe/dtype.h"
#include "moe/ep_layer.h"
#include "moe/expert_map.h"
#include "parallel/dispatch_plan.h"

namespace moe::parallel {

// `buffer` grown to at least `size` elements (never shrunk): buffers sized by the largest step.
template <typename T>
T* grown(std::vector<T>& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(static_cast<size_t>(size));
  return buffer.data();
}

// The slice of this rank's batch one dispatch sends.
struct DispatchInput {
  const void* hidden = nullptr;  // [*, H] of dtype: the whole batch, rows read by token index
  DType dtype = DType::kF32;
  const int32_t* topk_ids = nullptr;  // [num_tokens, k]: the slice's own rows
  const float* topk_weights = nullptr;
  int64_t first_token = 0;  // the slice is tokens [first_token, first_token + num_tokens)
  int64_t num_tokens = 0;
};

// The pairs this rank's experts compute, in the order combine sends their results back: by
// source rank, then in the order the source listed them.
struct ReceivedPairs {
  int64_t num_pairs = 0;
  const void* const* row_ptrs = nullptr;  // [num_pairs]: each pair's input row (H values of the
                                          // dispatch dtype), read in place
  const int32_t* slots = nullptr;         // [num_pairs]: global slots, all held by this rank
  const float* weights = nullptr;         // [num_pairs]: router weights
};

// This rank's pairs back from their experts.
struct CombinedPairs {
  const void* const* pair_rows = nullptr;  // [num_tokens * k]: the result of the slice's pair p
                                           // (H values of dtype)
  DType dtype = DType::kF32;               // the results' dtype, as start_combine was given
};

class Dispatcher {
 public:
  Dispatcher(Communicator& comm, const ExpertMap& map, int64_t hidden_size, int64_t top_k,
             int num_threads);
  virtual ~Dispatcher() = default;

  void start_dispatch(const DispatchInput& input, EpStepStats& stats);
  ReceivedPairs finish_dispatch(EpStepStats& stats);
  // results [received num_pairs, H] of dtype (f32 or bf16: cache3's, cpu::cache3_dtype) in
  // ReceivedPairs order; must stay valid until finish_combine returns. Every rank of a step
  // passes the same dtype (that of the layer's output).
  void start_combine(const void* results, DType dtype, EpStepStats& stats);
  CombinedPairs finish_combine(EpStepStats& stats);

 protected:
  // Sends the plan's rows (packed in send_rows(), dense by destination) and records to the other
  // ranks; finish_exchange fills their entries of sources_.
  virtual void start_exchange(EpStepStats& stats) = 0;
  virtual void finish_exchange(EpStepStats& stats) = 0;

  // What arrived from one source rank.
  struct Source {
    const PairRecord* records = nullptr;
    int64_t num_pairs = 0;
    int64_t num_rows = 0;
    const char* rows = nullptr;  // its rows, dense; null for this rank's own (read in the batch)
  };

  int64_t row_bytes() const { return hidden_size_ * static_cast<int64_t>(dtype_size(dtype_)); }
  // What travels to rank d: nothing for this rank itself.
  int64_t rows_sent_to(int d) const { return d == comm_.rank() ? 0 : plan_.rows_to(d); }
  int64_t pairs_sent_to(int d) const { return d == comm_.rank() ? 0 : plan_.pairs_to(d); }
  const char* send_rows() const { return send_rows_.data(); }
  // Adds a message's bytes to the per-peer counters of stats.
  void count_dispatch(EpStepStats& stats, int peer, int64_t sent, int64_t received) const;

  Communicator& comm_;
  const ExpertMap& map_;
  const int64_t hidden_size_, top_k_;
  const int num_threads_;
  ReplicaChooser chooser_;
  DType dtype_ = DType::kF32;
  DispatchPlan plan_;
  std::vector<Source> sources_;  // [N]: finish_exchange fills the other ranks'

  // Buffers that only grow (the low-latency dispatcher sizes them once, up front).
  std::vector<char> send_rows_;                 // [rows, H] of dtype, dense by destination
  std::vector<char> combine_received_;          // [num_pairs, H] of the results' dtype, in
                                                // record order
  std::vector<const void*> received_row_ptrs_;  // [received pairs]
  std::vector<int32_t> received_slots_;
  std::vector<float> received_weights_;
  std::vector<const void*> result_ptrs_;  // [num_pairs]

 private:
  const char* hidden_ = nullptr;   // the batch of the current dispatch
  const char* results_ = nullptr;  // the experts' output of the current combine
  DType results_dtype_ = DType::kF32;
  int64_t own_first_pair_ = 0;  // where this rank's own pairs start in the received order
  std::vector<int64_t> combine_send_counts_, combine_send_displs_;
  std::vector<int64_t> combine_recv_counts_, combine_recv_displs_;
  std::unique_ptr<CommRequest> combine_;
};

// The dispatcher of `kind` for one micro-batch.
std::unique_ptr<Dispatcher> make_dispatcher(DispatcherKind kind, Communicator& comm,
                                            const ExpertMap& map, int64_t hidden_size,
                                            int64_t top_k, int64_t low_latency_capacity,
                                            int num_threads);

}  // namespace moe::parallel
