// The NCCL communicator: each all-to-all is one NCCL group of ncclSend / ncclRecv per peer with
// something to move, enqueued on the communicator's stream, and a CUDA event after it that
// wait() polls. The NCCL communicator is non-blocking (ncclConfig_t::blocking = 0), so no call
// can hang the host: creation and every group are polled through ncclCommGetAsyncError, and a
// deadline that passes aborts the communicator.
//
// NOTE: ncclCommAbort frees the communicator, so it happens once (NcclHandle): requests still in
// flight after an abort (the other all-to-alls of a dispatch, waited for by their destructors)
// fail at once instead of polling a freed communicator, and the destructor does not abort again.
//
// Tested by tests/parallel/nccl/ (label gpu, skipped without a GPU).
#include "moe/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "moe/error.h"

namespace moe {

namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t code, const char* call) {
  if (code != cudaSuccess) {
    fail("CUDA: {} failed: {} ({})", call, cudaGetErrorString(code), static_cast<int>(code));
  }
}

void check_nccl(ncclResult_t code, const char* call) {
  if (code != ncclSuccess && code != ncclInProgress) {
    fail("NCCL: {} failed: {} ({})", call, ncclGetErrorString(code), static_cast<int>(code));
  }
}

// The NCCL communicator and whether it was aborted (which frees it).
struct NcclHandle {
  ncclComm_t comm = nullptr;
  bool aborted = false;

  void abort() {
    if (aborted) return;
    aborted = true;
    ncclCommAbort(comm);
  }
  // Throws when an earlier timeout aborted the communicator: nothing queued on it completes.
  void check_alive(int rank, const char* what) const {
    if (aborted) {
      fail("NCCL: rank {}: {}: the communicator was aborted by an earlier timeout", rank, what);
    }
  }
};

// Polls a non-blocking NCCL communicator until its pending call is done; aborts it and throws
// past the deadline.
void wait_for_nccl(NcclHandle& handle, Clock::time_point deadline, const char* call, int rank,
                   std::chrono::milliseconds timeout) {
  for (;;) {
    handle.check_alive(rank, call);
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(handle.comm, &state), "ncclCommGetAsyncError");
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      fail("NCCL: rank {}: {} failed: {} ({})", rank, call, ncclGetErrorString(state),
           static_cast<int>(state));
    }
    if (Clock::now() > deadline) {
      handle.abort();
      fail("NCCL: rank {} timed out after {} ms in {} (communicator aborted)", rank,
           timeout.count(), call);
    }
    std::this_thread::yield();
  }
}

class NcclRequest : public CommRequest {
 public:
  NcclRequest(NcclHandle& handle, cudaEvent_t event, int rank, uint64_t number,
              Clock::time_point deadline, std::chrono::milliseconds timeout)
      : handle_(handle),
        event_(event),
        rank_(rank),
        number_(number),
        deadline_(deadline),
        timeout_(timeout) {}

  void wait() override {
    const std::string what = fmt::format("operation #{}", number_);
    for (;;) {
      // Checked before the event: the kernels of an aborted communicator end without their data.
      handle_.check_alive(rank_, what.c_str());
      const cudaError_t done = cudaEventQuery(event_);
      if (done == cudaSuccess) return;
      if (done != cudaErrorNotReady) check_cuda(done, "cudaEventQuery");
      ncclResult_t state = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(handle_.comm, &state), "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) {
        fail("NCCL: rank {} operation #{} failed: {} ({})", rank_, number_,
             ncclGetErrorString(state), static_cast<int>(state));
      }
      if (Clock::now() > deadline_) {
        // NCCL does not say which peer is missing: every transfer of the group waits as one.
        handle_.abort();
        fail(
            "NCCL: rank {} timed out after {} ms in operation #{} (communicator aborted; a "
            "peer died, stalled or called another operation)",
            rank_, timeout_.count(), number_);
      }
      std::this_thread::yield();
    }
  }

 private:
  NcclHandle& handle_;
  cudaEvent_t event_;
  int rank_;
  uint64_t number_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(int rank, std::vector<int> hosts, int device, cudaStream_t stream,
                   bool owns_stream, ncclComm_t comm)
      : Communicator(rank, std::move(hosts)),
        device_(device),
        stream_(stream),
        owns_stream_(owns_stream),
        nccl_{comm} {
    check_cuda(cudaMalloc(&scratch_, static_cast<size_t>(2 * size()) * sizeof(int64_t)),
               "cudaMalloc");
    check_cuda(cudaMallocHost(&pinned_, static_cast<size_t>(2 * size()) * sizeof(int64_t)),
               "cudaMallocHost");
  }

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (failed()) {
      nccl_.abort();  // a no-op when a timeout already aborted it
    } else {
      ncclCommDestroy(nccl_.comm);
    }
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaFree(scratch_);
    cudaFreeHost(pinned_);
    if (owns_stream_) cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return "nccl"; }

  void barrier() override {
    // One byte from every rank to every rank through the device scratch; then the host waits.
    const std::vector<int64_t> ones(static_cast<size_t>(size()), 1);
    std::vector<int64_t> same_place(static_cast<size_t>(size()), 0);
    std::vector<int64_t> by_rank(static_cast<size_t>(size()));
    for (int p = 0; p < size(); ++p) by_rank[static_cast<size_t>(p)] = p;
    all_to_all_v(scratch_, {ones, same_place}, static_cast<char*>(scratch_) + size(),
                 {ones, by_rank});
  }

 protected:
  std::unique_ptr<CommRequest> start(const void* send, PeerSplits send_splits, void* recv,
                                     PeerSplits recv_splits, std::span<int64_t> received) override {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    const Clock::time_point deadline = Clock::now() + timeout();
    std::vector<int64_t> recv_counts(recv_splits.counts.begin(), recv_splits.counts.end());
    if (!received.empty()) {
      exchange_counts(send_splits.counts, recv_splits.counts, deadline, recv_counts);
      std::copy(recv_counts.begin(), recv_counts.end(), received.begin());
    }
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size(); ++p) {
      const size_t i = static_cast<size_t>(p);
      if (recv_counts[i] > 0) {
        check_nccl(ncclRecv(static_cast<char*>(recv) + recv_splits.displs[i],
                            static_cast<size_t>(recv_counts[i]), ncclUint8, p, nccl_.comm, stream_),
                   "ncclRecv");
      }
      if (send_splits.counts[i] > 0) {
        check_nccl(
            ncclSend(static_cast<const char*>(send) + send_splits.displs[i],
                     static_cast<size_t>(send_splits.counts[i]), ncclUint8, p, nccl_.comm, stream_),
            "ncclSend");
      }
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    wait_for_nccl(nccl_, deadline, "ncclGroupEnd", rank(), timeout());
    cudaEvent_t event = next_event();
    check_cuda(cudaEventRecord(event, stream_), "cudaEventRecord");
    return std::make_unique<NcclRequest>(nccl_, event, rank(), next_op_++, deadline, timeout());
  }

 private:
  // The bounded all-to-all's first half: each peer's size, through the device scratch.
  void exchange_counts(std::span<const int64_t> send_counts, std::span<const int64_t> bounds,
                       Clock::time_point deadline, std::vector<int64_t>& counts) {
    const size_t n = static_cast<size_t>(size());
    std::memcpy(pinned_, send_counts.data(), n * sizeof(int64_t));
    int64_t* device_out = static_cast<int64_t*>(scratch_);
    int64_t* device_in = device_out + n;
    check_cuda(
        cudaMemcpyAsync(device_out, pinned_, n * sizeof(int64_t), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size(); ++p) {
      check_nccl(ncclRecv(device_in + p, sizeof(int64_t), ncclUint8, p, nccl_.comm, stream_),
                 "ncclRecv");
      check_nccl(ncclSend(device_out + p, sizeof(int64_t), ncclUint8, p, nccl_.comm, stream_),
                 "ncclSend");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    wait_for_nccl(nccl_, deadline, "ncclGroupEnd", rank(), timeout());
    check_cuda(cudaMemcpyAsync(pinned_ + n, device_in, n * sizeof(int64_t), cudaMemcpyDeviceToHost,
                               stream_),
               "cudaMemcpyAsync");
    cudaEvent_t event = next_event();
    check_cuda(cudaEventRecord(event, stream_), "cudaEventRecord");
    NcclRequest(nccl_, event, rank(), next_op_++, deadline, timeout()).wait();
    for (size_t p = 0; p < n; ++p) {
      counts[p] = pinned_[n + p];
      if (counts[p] < 0 || counts[p] > bounds[p]) {
        fail("NCCL communicator: rank {}: rank {} sends {} bytes; expected at most {}", rank(), p,
             counts[p], bounds[p]);
      }
    }
  }

  // Events are reused round-robin: a request's event is only re-recorded after many more
  // operations, long after any caller waits for it.
  cudaEvent_t next_event() {
    constexpr size_t kEvents = 64;
    if (events_.size() < kEvents) {
      cudaEvent_t e;
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
      events_.push_back(e);
      return e;
    }
    return events_[next_event_++ % kEvents];
  }

  int device_;
  cudaStream_t stream_;
  bool owns_stream_;
  NcclHandle nccl_;
  void* scratch_ = nullptr;    // [2N] int64 on the device
  int64_t* pinned_ = nullptr;  // [2N] int64 pinned on the host
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
  uint64_t next_op_ = 0;
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, NcclOptions options) {
  if (bootstrap.device() != Device::kCpu) {
    fail(
        "make_nccl_communicator: expected a host-memory bootstrap communicator (e.g. MPI); got "
        "{}",
        bootstrap.name());
  }
  const int devices = cuda_device_count();
  if (devices < 1) fail("make_nccl_communicator: rank {} sees no CUDA device", bootstrap.rank());
  int device = options.device;
  if (device < 0) {
    int local_index = 0;
    for (int r = 0; r < bootstrap.rank(); ++r)
      local_index += bootstrap.same_host(r, bootstrap.rank());
    device = local_index % devices;
  }
  if (device >= devices) {
    fail("make_nccl_communicator: device: expected -1 or an id in [0, {}); got {}", devices,
         options.device);
  }
  check_cuda(cudaSetDevice(device), "cudaSetDevice");

  ncclUniqueId id;
  if (bootstrap.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::vector<ncclUniqueId> ids(static_cast<size_t>(bootstrap.size()));
  bootstrap.all_gather(&id, sizeof id, ids.data());

  cudaStream_t stream = options.stream;
  const bool owns_stream = stream == nullptr;
  if (owns_stream) {
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  NcclHandle handle;
  try {
    check_nccl(
        ncclCommInitRankConfig(&handle.comm, bootstrap.size(), ids[0], bootstrap.rank(), &config),
        "ncclCommInitRankConfig");
    wait_for_nccl(handle, Clock::now() + bootstrap.timeout(), "ncclCommInitRankConfig",
                  bootstrap.rank(), bootstrap.timeout());
    std::vector<int> hosts;
    for (int r = 0; r < bootstrap.size(); ++r) hosts.push_back(bootstrap.host_of(r));
    auto result = std::make_unique<NcclCommunicator>(bootstrap.rank(), std::move(hosts), device,
                                                     stream, owns_stream, handle.comm);
    result->set_timeout(bootstrap.timeout());
    return result;
  } catch (...) {
    if (handle.comm) handle.abort();
    if (owns_stream) cudaStreamDestroy(stream);
    throw;
  }
}

}  // namespace moe
