// The Communicator base: argument checks, host numbering, failure tracking, and all_gather and
// barrier built on the all-to-all every implementation provides (so they get the same deadline).
#include "moe/communicator.h"

#include <algorithm>
#include <map>

#include "moe/error.h"

namespace moe {

// Turns the first moe::Error of a wait into the communicator's failure, and waits for a request
// its owner dropped, so that no peer is left waiting on a rank that walked away.
class Communicator::GuardedRequest : public CommRequest {
 public:
  GuardedRequest(Communicator& comm, std::unique_ptr<CommRequest> inner)
      : comm_(comm), inner_(std::move(inner)) {}
  ~GuardedRequest() override {
    if (waited_) return;
    try {
      wait();
    } catch (const Error&) {  // already recorded as the communicator's failure
    }
  }
  void wait() override {
    waited_ = true;
    try {
      inner_->wait();
    } catch (const Error& e) {
      if (comm_.failure_.empty()) comm_.failure_ = e.what();
      throw;
    }
  }

 private:
  Communicator& comm_;
  std::unique_ptr<CommRequest> inner_;
  bool waited_ = false;
};

Communicator::Communicator(int rank, std::vector<int> host_of_rank)
    : rank_(rank), host_of_rank_(std::move(host_of_rank)) {
  if (host_of_rank_.empty()) fail("Communicator: expected at least one rank; got none");
  if (rank_ < 0 || rank_ >= size()) {
    fail("Communicator: expected rank in [0, {}); got {}", size(), rank_);
  }
  std::map<int, int> renumbered;  // given id -> id in the order of the host's lowest rank
  for (int& host : host_of_rank_) {
    const auto [it, inserted] = renumbered.emplace(host, static_cast<int>(renumbered.size()));
    host = it->second;
  }
  num_hosts_ = static_cast<int>(renumbered.size());
}

int Communicator::host_of(int rank) const {
  if (rank < 0 || rank >= size()) fail("host_of: expected rank in [0, {}); got {}", size(), rank);
  return host_of_rank_[static_cast<size_t>(rank)];
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) fail("timeout: expected > 0 ms; got {} ms", timeout.count());
  timeout_ = timeout;
}

void Communicator::check_usable(const char* operation) const {
  if (!failure_.empty()) {
    fail("{}: rank {}: the {} communicator failed earlier and cannot be used: {}", operation, rank_,
         name(), failure_);
  }
}

void Communicator::check_splits(const char* operation, const char* name, PeerSplits s) const {
  if (static_cast<int>(s.counts.size()) != size() || static_cast<int>(s.displs.size()) != size()) {
    fail("{}: {}: expected counts and displacements for {} peers; got {} and {}", operation, name,
         size(), s.counts.size(), s.displs.size());
  }
  for (int p = 0; p < size(); ++p) {
    if (s.counts[p] < 0 || s.displs[p] < 0) {
      fail("{}: {}: expected counts and displacements >= 0; got {} bytes at {} for peer {}",
           operation, name, s.counts[p], s.displs[p], p);
    }
  }
}

std::unique_ptr<CommRequest> Communicator::guarded_start(const char* operation, const void* send,
                                                         PeerSplits send_splits, void* recv,
                                                         PeerSplits recv_splits,
                                                         std::span<int64_t> received) {
  check_usable(operation);
  check_splits(operation, "send", send_splits);
  check_splits(operation, "recv", recv_splits);
  try {
    return std::make_unique<GuardedRequest>(*this,
                                            start(send, send_splits, recv, recv_splits, received));
  } catch (const Error& e) {
    if (failure_.empty()) failure_ = e.what();
    throw;
  }
}

std::unique_ptr<CommRequest> Communicator::start_all_to_all_v(const void* send,
                                                              PeerSplits send_splits, void* recv,
                                                              PeerSplits recv_splits) {
  return guarded_start("all_to_all_v", send, send_splits, recv, recv_splits, {});
}

void Communicator::all_to_all_v(const void* send, PeerSplits send_splits, void* recv,
                                PeerSplits recv_splits) {
  start_all_to_all_v(send, send_splits, recv, recv_splits)->wait();
}

std::unique_ptr<CommRequest> Communicator::start_all_to_all_bounded(const void* send,
                                                                    PeerSplits send_splits,
                                                                    void* recv,
                                                                    PeerSplits recv_bounds,
                                                                    std::span<int64_t> received) {
  if (static_cast<int>(received.size()) != size()) {
    fail("all_to_all_bounded: received: expected {} entries (one per peer); got {}", size(),
         received.size());
  }
  return guarded_start("all_to_all_bounded", send, send_splits, recv, recv_bounds, received);
}

void Communicator::all_gather(const void* send, int64_t bytes, void* recv) {
  if (bytes < 0) fail("all_gather: expected bytes >= 0; got {}", bytes);
  const size_t n = static_cast<size_t>(size());
  const std::vector<int64_t> counts(n, bytes), same_place(n, 0);
  std::vector<int64_t> by_rank(n);
  for (size_t p = 0; p < n; ++p) by_rank[p] = static_cast<int64_t>(p) * bytes;
  all_to_all_v(send, {counts, same_place}, recv, {counts, by_rank});
}

void Communicator::barrier() {
  const std::vector<int64_t> zeros(static_cast<size_t>(size()), 0);
  all_to_all_v(nullptr, {zeros, zeros}, nullptr, {zeros, zeros});
}

}  // namespace moe
