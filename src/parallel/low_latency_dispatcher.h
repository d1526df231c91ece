// The low-latency dispatcher (decode): no count exchange on the critical path. Every buffer is
// allocated once, for `capacity` token rows per (source, destination) pair of distinct ranks (a
// rank's rows for itself never travel). Each peer's
// message lands in its own fixed slot of the receive buffers, a bounded receive telling how much
// arrived: the rows in [N, capacity, H] (a masked layout: slot s holds rank s's rows, the header
// says how many are valid), the header and records in [N, header + capacity * k records].
//
// Overflow: a rank that would send some peer more than `capacity` rows sends every peer only a
// header that says so (rank, destination, rows needed); after the exchange every rank has every
// header, and all of them throw the same moe::Error with the counts. Nothing is dropped.
#pragma once

#include "parallel/dispatcher.h"

namespace moe::parallel {

class LowLatencyDispatcher : public Dispatcher {
 public:
  // capacity >= 1: token rows one rank may send one peer per micro-batch.
  LowLatencyDispatcher(Communicator& comm, const ExpertMap& map, int64_t hidden_size, int64_t top_k,
                       int64_t capacity, int num_threads);

 protected:
  void start_exchange(EpStepStats& stats) override;
  void finish_exchange(EpStepStats& stats) override;

 private:
  // The first bytes of every records message.
  struct Header {
    int32_t num_rows;
    int32_t num_pairs;
    int32_t worst_rows;  // the most rows the sender has for any one peer
    int32_t worst_peer;  // that peer
    int64_t reserved;    // keeps the records 8-byte aligned
  };
  static_assert(sizeof(Header) == 24 && sizeof(Header) % alignof(PairRecord) == 0);

  int64_t meta_slot_bytes() const;  // one peer's header and records

  int64_t capacity_;
  std::vector<char> send_meta_, recv_meta_;  // [N, meta_slot_bytes()]
  std::vector<char> recv_rows_;              // [N, capacity, H] at 4 bytes per value
  std::vector<int64_t> meta_counts_, meta_displs_, meta_bounds_, meta_slots_;
  std::vector<int64_t> rows_counts_, rows_displs_, rows_bounds_, rows_slots_;
  std::vector<int64_t> meta_received_, rows_received_;
  std::unique_ptr<CommRequest> meta_, rows_;
  bool overflow_ = false;
};

}  // namespace moe::parallel
