// Communicator: the collectives expert parallelism needs, behind one interface, so the dispatchers
// run unchanged over threads of one process (unit tests), MPI processes (CPU hosts,
// moe/mpi_communicator.h) and NCCL (GPUs, moe/nccl_communicator.h).
//
// Every rank of a group calls the same operations in the same order; a rank with nothing to send
// still calls (with zero counts). Every wait on peers has a deadline, timeout() after the operation
// started: when it passes, the wait throws moe::Error naming the rank, the operation and the peers
// it still waits for, and the communicator is failed: every later operation throws at once. What
// a timeout does and does not guarantee is in docs/parallel.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "moe/tensor.h"

namespace moe {

// Where each peer's bytes are in a buffer: counts[p] bytes at byte offset displs[p].
struct PeerSplits {
  std::span<const int64_t> counts;  // [size]
  std::span<const int64_t> displs;  // [size]
};

// An operation in flight. wait() returns once this rank's part is done: its send buffer may be
// reused and its receive buffer holds the data. It throws moe::Error when the deadline passes
// first. Destroying a request that was not waited for waits for it (and swallows a timeout).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(host_of_rank_.size()); }
  // Hosts are numbered 0.. in the order of their lowest rank; ranks of one host share its id.
  int host_of(int rank) const;
  bool same_host(int a, int b) const { return host_of(a) == host_of(b); }
  int num_hosts() const { return num_hosts_; }
  // Where the buffers of every operation live: kCpu (in-process, MPI) or kCuda (NCCL).
  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "in-process", "mpi", "nccl"

  std::chrono::milliseconds timeout() const { return timeout_; }
  // Throws moe::Error unless timeout > 0.
  void set_timeout(std::chrono::milliseconds timeout);

  // All-to-all with variable splits: sends send.counts[p] bytes at send + send.displs[p] to peer p
  // and receives recv.counts[p] bytes from peer p at recv + recv.displs[p]. recv.counts[p] must
  // equal what p sends here; a mismatch is a moe::Error on the receiving rank.
  void all_to_all_v(const void* send, PeerSplits send_splits, void* recv, PeerSplits recv_splits);
  std::unique_ptr<CommRequest> start_all_to_all_v(const void* send, PeerSplits send_splits,
                                                  void* recv, PeerSplits recv_splits);

  // All-to-all with bounded receives, for exchanges whose sizes the receiver does not know (no
  // count exchange first): peer p may send up to recv_bounds.counts[p] bytes; when wait() returns,
  // received[p] holds how many arrived. A message over its bound is a moe::Error on the receiver.
  std::unique_ptr<CommRequest> start_all_to_all_bounded(const void* send, PeerSplits send_splits,
                                                        void* recv, PeerSplits recv_bounds,
                                                        std::span<int64_t> received);

  // recv [size() * bytes]: rank p's `bytes` at offset p * bytes.
  void all_gather(const void* send, int64_t bytes, void* recv);
  // Returns once every rank has entered. The default is an all-to-all of empty messages, which
  // synchronizes where empty messages still travel (in-process, MPI); NCCL overrides it.
  virtual void barrier();

  // True after an operation timed out or failed; every later operation throws.
  bool failed() const { return !failure_.empty(); }

 protected:
  // host_of_rank [size]: any ids; they are renumbered in the order of their lowest rank.
  Communicator(int rank, std::vector<int> host_of_rank);

  // The implementation of an operation, its arguments checked. received is empty for exact
  // all-to-all (recv.counts are then exact), else [size] (recv.counts are bounds). A moe::Error
  // from the request's wait() fails the communicator.
  virtual std::unique_ptr<CommRequest> start(const void* send, PeerSplits send_splits, void* recv,
                                             PeerSplits recv_splits,
                                             std::span<int64_t> received) = 0;

 private:
  class GuardedRequest;
  std::unique_ptr<CommRequest> guarded_start(const char* operation, const void* send,
                                             PeerSplits send_splits, void* recv,
                                             PeerSplits recv_splits, std::span<int64_t> received);
  void check_usable(const char* operation) const;
  void check_splits(const char* operation, const char* name, PeerSplits splits) const;

  int rank_;
  int num_hosts_ = 1;
  std::vector<int> host_of_rank_;
  std::chrono::milliseconds timeout_{30000};
  std::string failure_;
};

// A group of `size` communicators whose ranks are threads of this process: element r is rank r,
// to be used by one thread. Copies happen in the receiving rank's wait(), so there is no overlap;
// it exists to test everything above the communicator. ranks_per_host > 0 pretends hosts of that
// many consecutive ranks (for the same-host / cross-host counters); 0 puts all on one host.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size, int ranks_per_host = 0);

}  // namespace moe
