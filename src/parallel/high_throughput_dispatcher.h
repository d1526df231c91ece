// The high-throughput dispatcher (prefill): first one all-to-all of two counts per peer (rows and
// records this rank sends it), then two all-to-alls sized exactly, in flight together: the
// records and the token rows. Received rows land densely by source, so the experts read them in
// place; buffers grow to the largest batch seen and are then reused.
#pragma once

#include "parallel/dispatcher.h"

namespace moe::parallel {

class HighThroughputDispatcher : public Dispatcher {
 public:
  HighThroughputDispatcher(Communicator& comm, const ExpertMap& map, int64_t hidden_size,
                           int64_t top_k, int num_threads);

 protected:
  void start_exchange(EpStepStats& stats) override;
  void finish_exchange(EpStepStats& stats) override;

 private:
  struct Splits {
    std::vector<int64_t> counts, displs;
    PeerSplits view() const { return {counts, displs}; }
  };

  std::vector<int64_t> sent_counts_, received_counts_;  // [N, 2]: rows, records per peer
  Splits send_records_, recv_records_, send_rows_splits_, recv_rows_splits_;
  std::vector<PairRecord> received_records_;
  std::vector<char> received_rows_buffer_;
  std::unique_ptr<CommRequest> records_, rows_;
};

}  // namespace moe::parallel
