#include "parallel/dispatcher.h"

#include <cstring>

#include "moe/error.h"
#include "parallel/high_throughput_dispatcher.h"
#include "parallel/low_latency_dispatcher.h"

namespace moe::parallel {

namespace {

std::vector<int> hosts_of(const Communicator& comm) {
  std::vector<int> hosts(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) hosts[static_cast<size_t>(r)] = comm.host_of(r);
  return hosts;
}

}  // namespace

Dispatcher::Dispatcher(Communicator& comm, const ExpertMap& map, int64_t hidden_size, int64_t top_k,
                       int num_threads)
    : comm_(comm),
      map_(map),
      hidden_size_(hidden_size),
      top_k_(top_k),
      num_threads_(num_threads),
      chooser_(map, comm.rank(), hosts_of(comm)) {
  const size_t n = static_cast<size_t>(comm.size());
  sources_.resize(n);
  combine_send_counts_.resize(n);
  combine_send_displs_.resize(n);
  combine_recv_counts_.resize(n);
  combine_recv_displs_.resize(n);
}

void Dispatcher::count_dispatch(EpStepStats& stats, int peer, int64_t sent,
                                int64_t received) const {
  stats.dispatch_bytes_sent[static_cast<size_t>(peer)] += sent;
  stats.dispatch_bytes_received[static_cast<size_t>(peer)] += received;
}

void Dispatcher::start_dispatch(const DispatchInput& in, EpStepStats& stats) {
  dtype_ = in.dtype;
  hidden_ = static_cast<const char*>(in.hidden);
  const int me = comm_.rank();
  plan_dispatch(map_, chooser_, me, in.topk_ids, in.topk_weights, in.first_token, in.num_tokens,
                top_k_, plan_);
  // Pack the rows for the other ranks; this rank's own stay where they are.
  const int64_t num_rows = plan_.row_offsets.back(), bytes = row_bytes();
  const int64_t own_begin = plan_.row_offsets[me], own_end = plan_.row_offsets[me + 1];
  char* packed = grown(send_rows_, num_rows * bytes);
#pragma omp parallel for num_threads(num_threads_) schedule(static)
  for (int64_t row = 0; row < num_rows; ++row) {
    if (row >= own_begin && row < own_end) continue;
    std::memcpy(packed + row * bytes, hidden_ + plan_.row_tokens[static_cast<size_t>(row)] * bytes,
                static_cast<size_t>(bytes));
  }
  stats.rows_sent += num_rows - (own_end - own_begin);
  stats.local_pairs += plan_.pairs_to(me);
  for (int d = 0; d < comm_.size(); ++d) {
    const int64_t payload = plan_.rows_to(d) * bytes;
    if (d == me) {
      stats.row_payload.self += payload;
    } else if (comm_.same_host(d, me)) {
      stats.row_payload.same_host += payload;
    } else {
      stats.row_payload.cross_host += payload;
    }
  }
  start_exchange(stats);
}

ReceivedPairs Dispatcher::finish_dispatch(EpStepStats& stats) {
  finish_exchange(stats);
  const int me = comm_.rank();
  Source& own = sources_[static_cast<size_t>(me)];
  own.records = plan_.records.data() + plan_.pair_offsets[me];
  own.num_pairs = plan_.pairs_to(me);
  own.num_rows = plan_.rows_to(me);
  own.rows = nullptr;
  int64_t total = 0;
  for (int s = 0; s < comm_.size(); ++s) {
    if (s == me) own_first_pair_ = total;
    total += sources_[static_cast<size_t>(s)].num_pairs;
  }
  const void** row_ptrs = grown(received_row_ptrs_, total);
  int32_t* slots = grown(received_slots_, total);
  float* weights = grown(received_weights_, total);
  const int64_t bytes = row_bytes();
  // Records come from other processes: every field that indexes memory is checked.
  int64_t i = 0;
  for (int s = 0; s < comm_.size(); ++s) {
    const Source& from = sources_[static_cast<size_t>(s)];
    for (int64_t r = 0; r < from.num_pairs; ++r, ++i) {
      const PairRecord& record = from.records[r];
      const bool slot_ok = record.slot >= 0 && record.slot < map_.num_slots() &&
                           map_.rank_of_slot(record.slot) == me;
      if (record.source_rank != s || !slot_ok || record.row < 0 || record.row >= from.num_rows ||
          record.j < 0 || record.j >= top_k_ || record.token < 0) {
        fail(
            "dispatch: rank {}: record {} from rank {} is corrupt: source rank {}, slot {} (of "
            "{}, held by rank {}), row {} (of {}), j {} (top-k {}), token {}",
            me, r, s, record.source_rank, record.slot, map_.num_slots(), slot_ok ? me : -1,
            record.row, from.num_rows, record.j, top_k_, record.token);
      }
      row_ptrs[i] = from.rows ? from.rows + record.row * bytes : hidden_ + record.token * bytes;
      slots[i] = record.slot;
      weights[i] = record.weight;
      ++stats.pairs_per_local_slot[static_cast<size_t>(map_.local_index(record.slot))];
    }
  }
  stats.pairs_received += total;
  ReceivedPairs received;
  received.num_pairs = total;
  received.row_ptrs = row_ptrs;
  received.slots = slots;
  received.weights = weights;
  return received;
}

void Dispatcher::start_combine(const void* results, DType dtype, EpStepStats& stats) {
  results_ = static_cast<const char*>(results);
  results_dtype_ = dtype;
  const int64_t bytes = hidden_size_ * static_cast<int64_t>(dtype_size(dtype));
  int64_t pairs_before = 0;
  for (int p = 0; p < comm_.size(); ++p) {
    const size_t i = static_cast<size_t>(p);
    const bool own = p == comm_.rank();
    combine_send_counts_[i] = own ? 0 : sources_[i].num_pairs * bytes;
    combine_send_displs_[i] = pairs_before * bytes;
    pairs_before += sources_[i].num_pairs;
    combine_recv_counts_[i] = own ? 0 : plan_.pairs_to(p) * bytes;
    combine_recv_displs_[i] = plan_.pair_offsets[i] * bytes;
    stats.combine_bytes_sent[i] += combine_send_counts_[i];
    stats.combine_bytes_received[i] += combine_recv_counts_[i];
  }
  char* received = grown(combine_received_, plan_.num_pairs * bytes);
  combine_ = comm_.start_all_to_all_v(results, {combine_send_counts_, combine_send_displs_},
                                      received, {combine_recv_counts_, combine_recv_displs_});
}

CombinedPairs Dispatcher::finish_combine(EpStepStats& stats) {
  combine_->wait();
  combine_.reset();
  // Each pair's result: back from its expert's rank, or in place in this rank's experts' output.
  const int me = comm_.rank();
  const int64_t own_begin = plan_.pair_offsets[me], own_end = plan_.pair_offsets[me + 1];
  const int64_t bytes = hidden_size_ * static_cast<int64_t>(dtype_size(results_dtype_));
  const void** rows = grown(result_ptrs_, plan_.num_pairs);
  for (int64_t p = 0; p < plan_.num_pairs; ++p) {
    const int64_t index = plan_.combine_index[static_cast<size_t>(p)];
    rows[p] = index >= own_begin && index < own_end
                  ? results_ + (own_first_pair_ + index - own_begin) * bytes
                  : combine_received_.data() + index * bytes;
  }
  return {rows, results_dtype_};
}

std::unique_ptr<Dispatcher> make_dispatcher(DispatcherKind kind, Communicator& comm,
                                            const ExpertMap& map, int64_t hidden_size,
                                            int64_t top_k, int64_t low_latency_capacity,
                                            int num_threads) {
  switch (kind) {
    case DispatcherKind::kHighThroughput:
      return std::make_unique<HighThroughputDispatcher>(comm, map, hidden_size, top_k, num_threads);
    case DispatcherKind::kLowLatency:
      return std::make_unique<LowLatencyDispatcher>(comm, map, hidden_size, top_k,
                                                    low_latency_capacity, num_threads);
  }
  fail("make_dispatcher: unsupported dispatcher {}", static_cast<int>(kind));
}

}  // namespace moe::parallel
