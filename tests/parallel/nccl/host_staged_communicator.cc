#include "parallel/nccl/host_staged_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "moe/error.h"

namespace moe::testing {

namespace {

void check_cuda(cudaError_t code, const char* call) {
  if (code != cudaSuccess) fail("CUDA: {} failed: {}", call, cudaGetErrorString(code));
}

// Bytes a buffer must hold for these splits.
int64_t extent(PeerSplits splits) {
  int64_t end = 0;
  for (size_t p = 0; p < splits.counts.size(); ++p) {
    end = std::max(end, splits.displs[p] + splits.counts[p]);
  }
  return end;
}

struct DeviceBuffer {
  explicit DeviceBuffer(int64_t bytes) {
    if (bytes > 0) check_cuda(cudaMalloc(&data, static_cast<size_t>(bytes)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(data); }
  void* data = nullptr;
};

// Copies back only what each peer sent, so the bytes between peers' regions stay untouched.
class StagedRequest : public CommRequest {
 public:
  StagedRequest(std::unique_ptr<DeviceBuffer> send, std::unique_ptr<DeviceBuffer> recv,
                std::unique_ptr<CommRequest> inner, char* host_recv, PeerSplits recv_splits,
                std::span<int64_t> received)
      : send_(std::move(send)),
        recv_(std::move(recv)),
        inner_(std::move(inner)),
        host_recv_(host_recv),
        counts_(recv_splits.counts.begin(), recv_splits.counts.end()),
        displs_(recv_splits.displs.begin(), recv_splits.displs.end()),
        received_(received) {}
  void wait() override {
    inner_->wait();
    for (size_t p = 0; p < counts_.size(); ++p) {
      const int64_t count = received_.empty() ? counts_[p] : received_[p];
      if (count == 0) continue;
      check_cuda(cudaMemcpy(host_recv_ + displs_[p], static_cast<char*>(recv_->data) + displs_[p],
                            static_cast<size_t>(count), cudaMemcpyDeviceToHost),
                 "cudaMemcpy");
    }
  }

 private:
  std::unique_ptr<DeviceBuffer> send_, recv_;
  std::unique_ptr<CommRequest> inner_;
  char* host_recv_;
  std::vector<int64_t> counts_, displs_;
  std::span<int64_t> received_;
};

class HostStagedCommunicator : public Communicator {
 public:
  explicit HostStagedCommunicator(Communicator& device_comm)
      : Communicator(device_comm.rank(), hosts_of(device_comm)), inner_(device_comm) {
    set_timeout(device_comm.timeout());
  }
  Device device() const override { return Device::kCpu; }
  std::string name() const override { return "host-staged " + inner_.name(); }

 protected:
  std::unique_ptr<CommRequest> start(const void* send, PeerSplits send_splits, void* recv,
                                     PeerSplits recv_splits, std::span<int64_t> received) override {
    const int64_t send_bytes = extent(send_splits), recv_bytes = extent(recv_splits);
    auto device_send = std::make_unique<DeviceBuffer>(send_bytes);
    auto device_recv = std::make_unique<DeviceBuffer>(recv_bytes);
    if (send_bytes > 0) {
      check_cuda(cudaMemcpy(device_send->data, send, static_cast<size_t>(send_bytes),
                            cudaMemcpyHostToDevice),
                 "cudaMemcpy");
    }
    std::unique_ptr<CommRequest> inner =
        received.empty()
            ? inner_.start_all_to_all_v(device_send->data, send_splits, device_recv->data,
                                        recv_splits)
            : inner_.start_all_to_all_bounded(device_send->data, send_splits, device_recv->data,
                                              recv_splits, received);
    return std::make_unique<StagedRequest>(std::move(device_send), std::move(device_recv),
                                           std::move(inner), static_cast<char*>(recv), recv_splits,
                                           received);
  }

 private:
  static std::vector<int> hosts_of(const Communicator& c) {
    std::vector<int> hosts;
    for (int r = 0; r < c.size(); ++r) hosts.push_back(c.host_of(r));
    return hosts;
  }
  Communicator& inner_;
};

}  // namespace

std::unique_ptr<Communicator> make_host_staged_communicator(Communicator& device_comm) {
  return std::make_unique<HostStagedCommunicator>(device_comm);
}

}  // namespace moe::testing
