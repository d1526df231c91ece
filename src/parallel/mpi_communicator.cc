// The MPI communicator: each all-to-all is one non-blocking receive from and one non-blocking send
// to every peer (a zero-byte message where there is nothing to say, so every pair of ranks meets
// in every operation), tagged with the operation's number. A progress thread posts and polls all
// requests; callers wait on a condition variable with a deadline.
//
// Point-to-point rather than MPI_Ialltoallv: the messages of one operation complete one by one,
// so a timeout can name the peers that never answered, and the bounded all-to-all is the same
// code with receives sized to the bound (MPI_Get_count says what arrived).
//
// NOTE: with MPI_THREAD_SERIALIZED only one thread may be inside MPI at a time. Set-up and
// teardown run on the caller's thread while the progress thread does not exist; in between only
// the progress thread calls MPI. Hence one MPI communicator per process at a time.
#include "moe/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "moe/error.h"

namespace moe {

namespace {

std::atomic<bool> g_communicator_alive{false};

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(length));
}

// For set-up and teardown calls on the caller's thread.
void check_mpi(int code, const char* call) {
  if (code != MPI_SUCCESS) fail("MPI: {} failed: {}", call, mpi_error_text(code));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

// One operation: its requests and what became of them. Fields below `mutex` in Engine are
// shared between the caller and the progress thread.
struct Operation {
  uint64_t number = 0;
  int tag = 0;
  const char* send = nullptr;
  char* recv = nullptr;
  std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;
  std::span<int64_t> received;  // bounded: [N]; exact: empty
  std::chrono::steady_clock::time_point deadline;

  // Owned by the progress thread once queued.
  std::vector<MPI_Request> requests;   // [2N]: receive from p at p, send to p at N + p
  std::vector<int> completed_indices;  // [2N], MPI_Testsome's outputs
  std::vector<MPI_Status> statuses;    // [2N]
  int pending = 0;

  // Guarded by Engine::mutex.
  bool done = false;
  bool abandoned = false;         // the waiter gave up: cancel what is still pending
  std::string error;              // set with done when something failed
  std::vector<int> silent_peers;  // peers whose message had not come when it was abandoned
  int uncancelled = 0;            // receives that could not be cancelled
};

// The progress thread and the queue it serves.
class Engine {
 public:
  Engine(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {
    thread_ = std::thread([this] { run(); });
  }
  ~Engine() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  void submit(const std::shared_ptr<Operation>& op) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(op);
    }
    changed_.notify_all();
  }

  // Waits for `op` until its deadline; throws moe::Error on failure or timeout.
  void wait(const std::shared_ptr<Operation>& op, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_until(lock, op->deadline, [&] { return op->done; })) {
      // Hand the operation back to the progress thread for cancelling; it answers at once.
      op->abandoned = true;
      changed_.notify_all();
      changed_.wait(lock, [&] { return op->done; });
      fail(
          "MPI communicator: rank {} timed out after {} ms in operation #{}: no message yet "
          "from ranks {}{}",
          rank_, timeout.count(), op->number, rank_list(op->silent_peers),
          op->uncancelled > 0
              ? fmt::format("; {} receives could not be cancelled and may still write their "
                            "buffers: end the job (MpiSession::abort)",
                            op->uncancelled)
              : "");
    }
    if (!op->error.empty()) throw Error(op->error);
  }

 private:
  void run() {
    std::vector<std::shared_ptr<Operation>> active;
    int idle_polls = 0;
    for (;;) {
      std::vector<std::shared_ptr<Operation>> fresh;
      {
        std::unique_lock lock(mutex_);
        if (active.empty() && queue_.empty()) {
          changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        }
        if (stop_ && queue_.empty() && active.empty()) return;
        fresh.assign(queue_.begin(), queue_.end());
        queue_.clear();
      }
      for (const auto& op : fresh) {
        post(*op);
        active.push_back(op);
      }
      bool progressed = !fresh.empty();
      for (auto it = active.begin(); it != active.end();) {
        Operation& op = **it;
        progressed |= poll(op);
        bool abandoned;
        {
          std::lock_guard lock(mutex_);
          abandoned = op.abandoned;
        }
        if (abandoned && op.pending > 0) cancel(op);
        if (op.pending == 0 || !op.error.empty() || abandoned) {
          finish(op);
          it = active.erase(it);
        } else {
          ++it;
        }
      }
      // Spin (yielding the core) while messages keep coming, then poll every 50 us: a rank
      // waiting long for a slow peer should not take a core from the ranks computing.
      idle_polls = progressed ? 0 : idle_polls + 1;
      if (idle_polls < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  void post(Operation& op) {
    op.requests.assign(static_cast<size_t>(2 * size_), MPI_REQUEST_NULL);
    op.completed_indices.resize(op.requests.size());
    op.statuses.resize(op.requests.size());
    for (int p = 0; p < size_ && op.error.empty(); ++p) {
      const int count = static_cast<int>(op.recv_counts[static_cast<size_t>(p)]);
      const int code = MPI_Irecv(op.recv + op.recv_displs[static_cast<size_t>(p)], count, MPI_BYTE,
                                 p, op.tag, comm_, &op.requests[static_cast<size_t>(p)]);
      if (code != MPI_SUCCESS) op.error = call_error(op, "MPI_Irecv", p, code);
    }
    for (int p = 0; p < size_ && op.error.empty(); ++p) {
      const int count = static_cast<int>(op.send_counts[static_cast<size_t>(p)]);
      const int code = MPI_Isend(op.send + op.send_displs[static_cast<size_t>(p)], count, MPI_BYTE,
                                 p, op.tag, comm_, &op.requests[static_cast<size_t>(size_ + p)]);
      if (code != MPI_SUCCESS) op.error = call_error(op, "MPI_Isend", p, code);
    }
    op.pending = 0;
    for (MPI_Request r : op.requests) op.pending += r != MPI_REQUEST_NULL;
  }

  // Tests the pending requests; returns whether any completed.
  bool poll(Operation& op) {
    if (op.pending == 0 || !op.error.empty()) return false;
    int completed = 0;
    std::vector<int>& indices = op.completed_indices;
    std::vector<MPI_Status>& statuses = op.statuses;
    const int code = MPI_Testsome(static_cast<int>(op.requests.size()), op.requests.data(),
                                  &completed, indices.data(), statuses.data());
    if (code != MPI_SUCCESS && code != MPI_ERR_IN_STATUS) {
      op.error = call_error(op, "MPI_Testsome", -1, code);
      return false;
    }
    if (completed == MPI_UNDEFINED) return false;
    for (int i = 0; i < completed; ++i) {
      const int index = indices[static_cast<size_t>(i)];
      const MPI_Status& status = statuses[static_cast<size_t>(i)];
      const bool is_receive = index < size_;
      const int peer = is_receive ? index : index - size_;
      --op.pending;
      if (code == MPI_ERR_IN_STATUS && status.MPI_ERROR != MPI_SUCCESS) {
        op.error = call_error(op, is_receive ? "receive from" : "send to", peer, status.MPI_ERROR);
        continue;
      }
      if (!is_receive) continue;
      int count = 0;
      MPI_Get_count(&status, MPI_BYTE, &count);
      if (!op.received.empty()) {
        op.received[static_cast<size_t>(peer)] = count;
      } else if (count != op.recv_counts[static_cast<size_t>(peer)]) {
        op.error = fmt::format(
            "MPI communicator: rank {} operation #{}: rank {} sent {} bytes; expected exactly {}",
            rank_, op.number, peer, count, op.recv_counts[static_cast<size_t>(peer)]);
      }
    }
    return completed > 0;
  }

  // Cancels the pending receives of an abandoned operation and forgets its sends (a send cannot
  // be cancelled portably; its buffer is only read).
  void cancel(Operation& op) {
    std::vector<int> silent;
    for (int p = 0; p < size_; ++p) {
      MPI_Request& r = op.requests[static_cast<size_t>(p)];
      if (r == MPI_REQUEST_NULL) continue;
      silent.push_back(p);
      MPI_Cancel(&r);
      MPI_Status status;
      int flag = 0;
      // A receive nothing matched completes at once as cancelled; one already matched cannot be.
      for (int attempt = 0; attempt < 100 && !flag; ++attempt) MPI_Test(&r, &flag, &status);
      int cancelled = 0;
      if (flag) MPI_Test_cancelled(&status, &cancelled);
      if (!flag) {
        MPI_Request_free(&r);
        ++op.uncancelled;
      }
    }
    for (int p = 0; p < size_; ++p) {
      MPI_Request& r = op.requests[static_cast<size_t>(size_ + p)];
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    op.pending = 0;
    op.silent_peers = std::move(silent);
  }

  void finish(Operation& op) {
    if (!op.error.empty() && op.pending > 0) cancel(op);
    {
      std::lock_guard lock(mutex_);
      op.done = true;
    }
    changed_.notify_all();
  }

  std::string call_error(const Operation& op, const char* what, int peer, int code) const {
    return fmt::format("MPI communicator: rank {} operation #{}: {} {} failed: {}", rank_,
                       op.number, what, peer >= 0 ? fmt::format("rank {}", peer) : "",
                       mpi_error_text(code));
  }

  MPI_Comm comm_;
  int rank_, size_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::shared_ptr<Operation>> queue_;
  bool stop_ = false;
};

class MpiRequest : public CommRequest {
 public:
  MpiRequest(Engine& engine, std::shared_ptr<Operation> op, std::chrono::milliseconds timeout)
      : engine_(engine), op_(std::move(op)), timeout_(timeout) {}
  void wait() override { engine_.wait(op_, timeout_); }

 private:
  Engine& engine_;
  std::shared_ptr<Operation> op_;
  std::chrono::milliseconds timeout_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, std::vector<int> hosts)
      : Communicator(rank, std::move(hosts)), comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    int found = 0;
    int* tag_upper_bound = nullptr;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_upper_bound, &found);
    tag_modulus_ = found && tag_upper_bound ? *tag_upper_bound + int64_t{1} : 32768;
    engine_ = std::make_unique<Engine>(comm_, rank, size());
  }

  ~MpiCommunicator() override {
    engine_.reset();  // joins the progress thread; MPI is the caller's again
    // A failed communicator may still have requests in flight: freeing it could block.
    if (!failed()) MPI_Comm_free(&comm_);
    g_communicator_alive = false;
  }

  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "mpi"; }

 protected:
  std::unique_ptr<CommRequest> start(const void* send, PeerSplits send_splits, void* recv,
                                     PeerSplits recv_splits, std::span<int64_t> received) override {
    auto op = std::make_shared<Operation>();
    op->number = next_op_++;
    op->tag = static_cast<int>(op->number % tag_modulus_);
    op->send = static_cast<const char*>(send);
    op->recv = static_cast<char*>(recv);
    op->send_counts.assign(send_splits.counts.begin(), send_splits.counts.end());
    op->send_displs.assign(send_splits.displs.begin(), send_splits.displs.end());
    op->recv_counts.assign(recv_splits.counts.begin(), recv_splits.counts.end());
    op->recv_displs.assign(recv_splits.displs.begin(), recv_splits.displs.end());
    op->received = received;
    for (int p = 0; p < size(); ++p) {
      const int64_t largest = std::max(op->send_counts[static_cast<size_t>(p)],
                                       op->recv_counts[static_cast<size_t>(p)]);
      if (largest > INT_MAX) {
        fail(
            "MPI communicator: rank {}: a message of {} bytes with rank {} exceeds MPI's int "
            "count ({} bytes); use smaller batches",
            rank(), largest, p, INT_MAX);
      }
    }
    op->deadline = std::chrono::steady_clock::now() + timeout();
    engine_->submit(op);
    return std::make_unique<MpiRequest>(*engine_, std::move(op), timeout());
  }

 private:
  MPI_Comm comm_;
  int64_t tag_modulus_ = 32768;
  uint64_t next_op_ = 0;
  std::unique_ptr<Engine> engine_;
};

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  if (initialized) fail("MpiSession: MPI is already initialized; create one session per program");
  int provided = MPI_THREAD_SINGLE;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    fail(
        "MpiSession: the MPI library gives thread level {}; the progress thread needs "
        "MPI_THREAD_SERIALIZED ({})",
        provided, MPI_THREAD_SERIALIZED);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiSession::~MpiSession() { MPI_Finalize(); }

void MpiSession::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
}

std::unique_ptr<Communicator> make_mpi_communicator(MpiOptions options) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) fail("make_mpi_communicator: no MpiSession is active");
  if (options.ranks_per_host < 0) {
    fail("make_mpi_communicator: ranks_per_host: expected >= 0 (0 = as MPI sees them); got {}",
         options.ranks_per_host);
  }
  if (g_communicator_alive.exchange(true)) {
    fail(
        "make_mpi_communicator: another MPI communicator still lives in this process (one at a "
        "time: each has a progress thread and MPI runs at MPI_THREAD_SERIALIZED)");
  }
  try {
    MPI_Comm comm;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    // Each rank's host: the lowest rank of its shared-memory group.
    int leader = rank;
    if (options.ranks_per_host > 0) {
      leader = rank / options.ranks_per_host * options.ranks_per_host;
    } else {
      MPI_Comm node;
      check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node),
                "MPI_Comm_split_type");
      check_mpi(MPI_Allreduce(&rank, &leader, 1, MPI_INT, MPI_MIN, node), "MPI_Allreduce");
      MPI_Comm_free(&node);
    }
    std::vector<int> hosts(static_cast<size_t>(size));
    check_mpi(MPI_Allgather(&leader, 1, MPI_INT, hosts.data(), 1, MPI_INT, comm), "MPI_Allgather");
    return std::make_unique<MpiCommunicator>(comm, rank, std::move(hosts));
  } catch (...) {
    g_communicator_alive = false;
    throw;
  }
}

}  // namespace moe
