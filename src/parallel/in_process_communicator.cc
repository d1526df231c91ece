// The in-process communicator: ranks are threads sharing one Group. An operation is a numbered
// rendezvous: each rank posts its buffers under its next operation number, and in wait() copies
// what every peer posted for it (a pull), then waits until every peer is finished with it, so its
// send buffer is free when wait() returns. Operation numbers are per rank, so ranks calling the
// same operations in the same order meet in the same rendezvous, however far apart in time.
//
// Copies happen under the group's lock: slower than parallel copies, but a rank that times out
// can withdraw its posting atomically, so no peer ever reads a buffer its owner has given up.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "moe/communicator.h"
#include "moe/error.h"

namespace moe {

namespace {

struct Posting {
  const char* send = nullptr;
  std::vector<int64_t> send_counts, send_displs;
  bool bounded = false;
  bool posted = false;
  bool withdrawn = false;  // its rank timed out or failed: its buffers are gone
  bool finished = false;   // its rank pulled its data, or withdrew
};

struct Rendezvous {
  std::vector<Posting> postings;  // [size]
  int num_posted = 0;
  int num_left = 0;  // ranks whose wait() returned
};

struct Group {
  explicit Group(int size) : size(size) {}
  const int size;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, Rendezvous> rendezvous;  // by operation number
};

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

std::vector<int> ranks_where(const Rendezvous& r, bool Posting::*flag, bool value) {
  std::vector<int> ranks;
  for (size_t p = 0; p < r.postings.size(); ++p) {
    if (r.postings[p].*flag == value) ranks.push_back(static_cast<int>(p));
  }
  return ranks;
}

class InProcessRequest : public CommRequest {
 public:
  InProcessRequest(Group& group, int rank, uint64_t op, std::chrono::milliseconds timeout,
                   char* recv, std::vector<int64_t> recv_counts, std::vector<int64_t> recv_displs,
                   std::span<int64_t> received)
      : group_(group),
        rank_(rank),
        op_(op),
        deadline_(std::chrono::steady_clock::now() + timeout),
        timeout_(timeout),
        recv_(recv),
        recv_counts_(std::move(recv_counts)),
        recv_displs_(std::move(recv_displs)),
        received_(received) {}

  void wait() override {
    std::unique_lock lock(group_.mutex);
    Rendezvous& r = group_.rendezvous[op_];
    Posting& mine = r.postings[static_cast<size_t>(rank_)];
    if (!group_.changed.wait_until(lock, deadline_, [&] { return r.num_posted == group_.size; })) {
      withdraw(mine);
      fail(
          "in-process communicator: rank {} timed out after {} ms in operation #{}: ranks {} "
          "never started it",
          rank_, timeout_.count(), op_, rank_list(ranks_where(r, &Posting::posted, false)));
    }
    const std::vector<int> gone = ranks_where(r, &Posting::withdrawn, true);
    if (!gone.empty()) {
      withdraw(mine);
      fail(
          "in-process communicator: rank {} in operation #{}: ranks {} gave up on it (timed out "
          "or failed)",
          rank_, op_, rank_list(gone));
    }
    // A bad message is this rank's error; it still serves its own data to the peers first, as
    // a real network would have delivered it.
    std::string error;
    for (int p = 0; p < group_.size; ++p) {
      if (error.empty()) error = pull_from(r, p);
    }
    mine.finished = true;
    group_.changed.notify_all();
    const auto everyone_finished = [&] {
      return ranks_where(r, &Posting::finished, false).empty();
    };
    if (!group_.changed.wait_until(lock, deadline_, everyone_finished)) {
      withdraw(mine);
      fail(
          "in-process communicator: rank {} timed out after {} ms in operation #{}: ranks {} "
          "have not taken their data",
          rank_, timeout_.count(), op_, rank_list(ranks_where(r, &Posting::finished, false)));
    }
    // The last rank out removes the rendezvous (never reached once a rank withdrew: a failed
    // group leaks one small record).
    if (++r.num_left == group_.size) group_.rendezvous.erase(op_);
    if (!error.empty()) throw Error(error);
  }

 private:
  void withdraw(Posting& mine) {
    mine.withdrawn = true;
    mine.finished = true;
    mine.send = nullptr;
    group_.changed.notify_all();
  }

  // Copies peer p's bytes for this rank; returns an error message, empty on success.
  std::string pull_from(const Rendezvous& r, int p) {
    const Posting& from = r.postings[static_cast<size_t>(p)];
    const size_t me = static_cast<size_t>(rank_), peer = static_cast<size_t>(p);
    const int64_t count = from.send_counts[me];
    const bool bounded = !received_.empty();
    if (from.bounded != bounded) {
      return fmt::format(
          "in-process communicator: rank {} operation #{} is an {} but rank {} called {}", rank_,
          op_, bounded ? "all_to_all_bounded" : "all_to_all_v", p,
          from.bounded ? "all_to_all_bounded" : "all_to_all_v");
    }
    if (bounded ? count > recv_counts_[peer] : count != recv_counts_[peer]) {
      return fmt::format(
          "in-process communicator: rank {} operation #{}: rank {} sends {} bytes; expected {} {}",
          rank_, op_, p, count, bounded ? "at most" : "exactly", recv_counts_[peer]);
    }
    if (count > 0) std::memcpy(recv_ + recv_displs_[peer], from.send + from.send_displs[me], count);
    if (bounded) received_[peer] = count;
    return {};
  }

  Group& group_;
  int rank_;
  uint64_t op_;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
  char* recv_;
  std::vector<int64_t> recv_counts_, recv_displs_;
  std::span<int64_t> received_;
};

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> group, int rank, std::vector<int> hosts)
      : Communicator(rank, std::move(hosts)), group_(std::move(group)) {}

  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "in-process"; }

 protected:
  std::unique_ptr<CommRequest> start(const void* send, PeerSplits send_splits, void* recv,
                                     PeerSplits recv_splits, std::span<int64_t> received) override {
    const uint64_t op = next_op_++;
    {
      std::lock_guard lock(group_->mutex);
      Rendezvous& r = group_->rendezvous[op];
      if (r.postings.empty()) r.postings.resize(static_cast<size_t>(group_->size));
      Posting& mine = r.postings[static_cast<size_t>(rank())];
      mine.send = static_cast<const char*>(send);
      mine.send_counts.assign(send_splits.counts.begin(), send_splits.counts.end());
      mine.send_displs.assign(send_splits.displs.begin(), send_splits.displs.end());
      mine.bounded = !received.empty();
      mine.posted = true;
      ++r.num_posted;
    }
    group_->changed.notify_all();
    return std::make_unique<InProcessRequest>(
        *group_, rank(), op, timeout(), static_cast<char*>(recv),
        std::vector<int64_t>(recv_splits.counts.begin(), recv_splits.counts.end()),
        std::vector<int64_t>(recv_splits.displs.begin(), recv_splits.displs.end()), received);
  }

 private:
  std::shared_ptr<Group> group_;
  uint64_t next_op_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int size, int ranks_per_host) {
  if (size < 1) fail("make_in_process_group: expected size >= 1; got {}", size);
  if (ranks_per_host < 0) {
    fail("make_in_process_group: expected ranks_per_host >= 0 (0 = one host); got {}",
         ranks_per_host);
  }
  std::vector<int> hosts(static_cast<size_t>(size), 0);
  for (int r = 0; r < size; ++r)
    hosts[static_cast<size_t>(r)] = ranks_per_host ? r / ranks_per_host : 0;
  auto group = std::make_shared<Group>(size);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r) {
    comms.push_back(std::make_unique<InProcessCommunicator>(group, r, hosts));
  }
  return comms;
}

}  // namespace moe
