#include "parallel/low_latency_dispatcher.h"

#include <algorithm>
#include <cstring>

#include "moe/error.h"

namespace moe::parallel {

LowLatencyDispatcher::LowLatencyDispatcher(Communicator& comm, const ExpertMap& map,
                                           int64_t hidden_size, int64_t top_k, int64_t capacity,
                                           int num_threads)
    : Dispatcher(comm, map, hidden_size, top_k, num_threads), capacity_(capacity) {
  if (capacity < 1 || capacity > INT32_MAX / top_k) {
    fail("low-latency dispatcher: expected a capacity in [1, {}] token rows per peer; got {}",
         INT32_MAX / top_k, capacity);
  }
  const size_t n = static_cast<size_t>(comm.size());
  // Every buffer at its largest, once: rows at 4 bytes per value cover every hidden dtype, and
  // every results dtype (f32 or bf16).
  const int64_t max_row_bytes = hidden_size * static_cast<int64_t>(sizeof(float));
  send_meta_.resize(n * static_cast<size_t>(meta_slot_bytes()));
  recv_meta_.resize(send_meta_.size());
  recv_rows_.resize(n * static_cast<size_t>(capacity * max_row_bytes));
  send_rows_.resize(recv_rows_.size());
  combine_received_.resize(static_cast<size_t>(capacity * top_k * max_row_bytes));
  received_slots_.resize(n * static_cast<size_t>(capacity * top_k));
  received_row_ptrs_.resize(received_slots_.size());
  result_ptrs_.resize(static_cast<size_t>(capacity * top_k));
  received_weights_.resize(received_slots_.size());
  for (std::vector<int64_t>* v :
       {&meta_counts_, &meta_displs_, &meta_bounds_, &meta_slots_, &rows_counts_, &rows_displs_,
        &rows_bounds_, &rows_slots_, &meta_received_, &rows_received_}) {
    v->resize(n);
  }
}

int64_t LowLatencyDispatcher::meta_slot_bytes() const {
  return static_cast<int64_t>(sizeof(Header)) +
         capacity_ * top_k_ * static_cast<int64_t>(sizeof(PairRecord));
}

void LowLatencyDispatcher::start_exchange(EpStepStats& stats) {
  const int N = comm_.size();
  const int64_t bytes = row_bytes(), slot_bytes = meta_slot_bytes();
  Header mine{};
  for (int d = 0; d < N; ++d) {
    if (rows_sent_to(d) > mine.worst_rows) {
      mine.worst_rows = static_cast<int32_t>(std::min<int64_t>(rows_sent_to(d), INT32_MAX));
      mine.worst_peer = d;
    }
  }
  overflow_ = mine.worst_rows > capacity_;
  for (int d = 0; d < N; ++d) {
    const size_t i = static_cast<size_t>(d);
    // On overflow every peer gets the header alone: the step fails everywhere after the exchange.
    Header header = mine;
    header.num_rows = overflow_ ? 0 : static_cast<int32_t>(rows_sent_to(d));
    header.num_pairs = overflow_ ? 0 : static_cast<int32_t>(pairs_sent_to(d));
    char* slot = send_meta_.data() + d * slot_bytes;
    std::memcpy(slot, &header, sizeof header);
    if (header.num_pairs > 0) {
      std::memcpy(slot + sizeof header, plan_.records.data() + plan_.pair_offsets[i],
                  header.num_pairs * sizeof(PairRecord));
    }
    meta_counts_[i] = static_cast<int64_t>(sizeof header + header.num_pairs * sizeof(PairRecord));
    meta_displs_[i] = d * slot_bytes;
    meta_bounds_[i] = slot_bytes;
    meta_slots_[i] = d * slot_bytes;
    rows_counts_[i] = header.num_rows * bytes;
    rows_displs_[i] = plan_.row_offsets[i] * bytes;
    rows_bounds_[i] = capacity_ * bytes;
    rows_slots_[i] = d * capacity_ * bytes;
  }
  meta_ = comm_.start_all_to_all_bounded(send_meta_.data(), {meta_counts_, meta_displs_},
                                         recv_meta_.data(), {meta_bounds_, meta_slots_},
                                         meta_received_);
  rows_ =
      comm_.start_all_to_all_bounded(send_rows(), {rows_counts_, rows_displs_}, recv_rows_.data(),
                                     {rows_bounds_, rows_slots_}, rows_received_);
}

void LowLatencyDispatcher::finish_exchange(EpStepStats& stats) {
  meta_->wait();
  rows_->wait();
  meta_.reset();
  rows_.reset();
  const int N = comm_.size(), me = comm_.rank();
  const int64_t bytes = row_bytes(), slot_bytes = meta_slot_bytes();
  for (int p = 0; p < N; ++p) {
    const size_t i = static_cast<size_t>(p);
    count_dispatch(stats, p, meta_counts_[i] + rows_counts_[i],
                   meta_received_[i] + rows_received_[i]);
  }
  // Overflow first: every rank sees every header, so every rank reports the same ranks.
  std::string overflows;
  for (int s = 0; s < N; ++s) {
    if (meta_received_[static_cast<size_t>(s)] < static_cast<int64_t>(sizeof(Header))) {
      fail(
          "low-latency dispatch: rank {}: the message from rank {} has {} bytes, less than its "
          "header",
          me, s, meta_received_[static_cast<size_t>(s)]);
    }
    Header h;
    std::memcpy(&h, recv_meta_.data() + s * slot_bytes, sizeof h);
    if (h.worst_rows > capacity_) {
      overflows += fmt::format("{}rank {} has {} rows for rank {}", overflows.empty() ? "" : "; ",
                               s, h.worst_rows, h.worst_peer);
    }
  }
  if (!overflows.empty()) {
    fail(
        "low-latency dispatch overflow: capacity {} token rows per peer; {} (raise "
        "low_latency_capacity to at least the tokens per rank and micro-batch, or use the "
        "high-throughput dispatcher)",
        capacity_, overflows);
  }
  for (int s = 0; s < N; ++s) {
    const size_t i = static_cast<size_t>(s);
    Header h;
    const char* slot = recv_meta_.data() + s * slot_bytes;
    std::memcpy(&h, slot, sizeof h);
    const int64_t meta_expected = static_cast<int64_t>(sizeof h + h.num_pairs * sizeof(PairRecord));
    if (h.num_rows < 0 || h.num_pairs < h.num_rows || h.num_rows > capacity_ ||
        meta_received_[i] != meta_expected || rows_received_[i] != h.num_rows * bytes) {
      fail(
          "low-latency dispatch: rank {}: the messages from rank {} disagree: header {} rows and "
          "{} records (capacity {}), {} record bytes and {} row bytes arrived",
          me, s, h.num_rows, h.num_pairs, capacity_, meta_received_[i], rows_received_[i]);
    }
    Source& from = sources_[i];
    from.records = reinterpret_cast<const PairRecord*>(slot + sizeof h);
    from.num_pairs = h.num_pairs;
    from.num_rows = h.num_rows;
    from.rows = recv_rows_.data() + s * capacity_ * bytes;
  }
}

}  // namespace moe::parallel
