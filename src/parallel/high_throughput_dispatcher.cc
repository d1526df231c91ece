#include "parallel/high_throughput_dispatcher.h"

#include "moe/error.h"

namespace moe::parallel {

namespace {

constexpr int64_t kCountBytes = 2 * sizeof(int64_t);  // rows, records

}  // namespace

HighThroughputDispatcher::HighThroughputDispatcher(Communicator& comm, const ExpertMap& map,
                                                   int64_t hidden_size, int64_t top_k,
                                                   int num_threads)
    : Dispatcher(comm, map, hidden_size, top_k, num_threads) {
  const size_t n = static_cast<size_t>(comm.size());
  sent_counts_.resize(2 * n);
  received_counts_.resize(2 * n);
  for (Splits* s : {&send_records_, &recv_records_, &send_rows_splits_, &recv_rows_splits_}) {
    s->counts.resize(n);
    s->displs.resize(n);
  }
}

void HighThroughputDispatcher::start_exchange(EpStepStats& stats) {
  const int N = comm_.size();
  for (int d = 0; d < N; ++d) {
    sent_counts_[2 * d] = rows_sent_to(d);
    sent_counts_[2 * d + 1] = pairs_sent_to(d);
  }
  // The one exchange whose sizes everybody knows: two counts per other rank.
  {
    const int me = comm_.rank();
    std::vector<int64_t> counts(static_cast<size_t>(N), kCountBytes);
    std::vector<int64_t> displs(static_cast<size_t>(N));
    for (int p = 0; p < N; ++p) displs[static_cast<size_t>(p)] = p * kCountBytes;
    counts[static_cast<size_t>(me)] = 0;
    received_counts_[2 * me] = received_counts_[2 * me + 1] = 0;
    comm_.all_to_all_v(sent_counts_.data(), {counts, displs}, received_counts_.data(),
                       {counts, displs});
    for (int p = 0; p < N; ++p) count_dispatch(stats, p, counts[p], counts[p]);
  }

  const int64_t record_bytes = sizeof(PairRecord), bytes = row_bytes();
  int64_t rows_in = 0, records_in = 0;
  for (int p = 0; p < N; ++p) {
    const size_t i = static_cast<size_t>(p);
    const int64_t rows = received_counts_[2 * i], records = received_counts_[2 * i + 1];
    if (rows < 0 || records < 0 || rows > records) {
      fail(
          "dispatch: rank {}: rank {} announces {} rows and {} records (expected 0 <= rows <= "
          "records)",
          comm_.rank(), p, rows, records);
    }
    Source& from = sources_[i];
    from.num_rows = rows;
    from.num_pairs = records;
    send_records_.counts[i] = pairs_sent_to(p) * record_bytes;
    send_records_.displs[i] = plan_.pair_offsets[i] * record_bytes;
    recv_records_.counts[i] = records * record_bytes;
    recv_records_.displs[i] = records_in * record_bytes;
    send_rows_splits_.counts[i] = rows_sent_to(p) * bytes;
    send_rows_splits_.displs[i] = plan_.row_offsets[i] * bytes;
    recv_rows_splits_.counts[i] = rows * bytes;
    recv_rows_splits_.displs[i] = rows_in * bytes;
    rows_in += rows;
    records_in += records;
    count_dispatch(stats, p, send_records_.counts[i] + send_rows_splits_.counts[i],
                   recv_records_.counts[i] + recv_rows_splits_.counts[i]);
  }
  PairRecord* records = grown(received_records_, records_in);
  char* rows = grown(received_rows_buffer_, rows_in * bytes);
  records_ = comm_.start_all_to_all_v(plan_.records.data(), send_records_.view(), records,
                                      recv_records_.view());
  rows_ = comm_.start_all_to_all_v(send_rows(), send_rows_splits_.view(), rows,
                                   recv_rows_splits_.view());
  int64_t records_before = 0, rows_before = 0;
  for (Source& from : sources_) {
    from.records = records + records_before;
    from.rows = rows + rows_before * bytes;
    records_before += from.num_pairs;
    rows_before += from.num_rows;
  }
}

void HighThroughputDispatcher::finish_exchange(EpStepStats& stats) {
  records_->wait();
  rows_->wait();
  records_.reset();
  rows_.reset();
}

}  // namespace moe::parallel
