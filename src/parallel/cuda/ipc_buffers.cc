#include "parallel/cuda/ipc_buffers.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cstring>

#include "kernels/cuda/check.h"
#include "moe/error.h"
#include "parallel/cuda/ep_status.h"

namespace moe::cuda::ep {
namespace {

// What each rank tells the others: its handle, its size, and where its device sits on the bus
// (device ordinals differ between processes, bus ids do not).
struct Announcement {
  cudaIpcMemHandle_t handle;
  uint64_t bytes;
  std::array<char, 32> pci_bus_id;
};

// Peer access for the mappings: explicit where the peer's device is visible in this process
// (cudaIpcMemLazyEnablePeerAccess covers the case where it is not, e.g. CUDA_VISIBLE_DEVICES).
void enable_peer_access(int device, const Announcement& peer, int peer_rank) {
  int peer_device = -1;
  if (cudaDeviceGetByPCIBusId(&peer_device, peer.pci_bus_id.data()) != cudaSuccess) {
    cudaGetLastError();  // not visible here: rely on the lazy enable of the IPC mapping
    return;
  }
  if (peer_device == device) return;
  int can_access = 0;
  check(cudaDeviceCanAccessPeer(&can_access, device, peer_device), "cudaDeviceCanAccessPeer");
  if (!can_access) {
    fail(
        "CUDA IPC: device {} cannot access rank {}'s device {} (bus {}) peer to peer; the "
        "low-latency path needs NVLink or PCIe P2P between every pair of GPUs (use the "
        "high-throughput path through NCCL)",
        device, peer_rank, peer_device, peer.pci_bus_id.data());
  }
  const cudaError_t status = cudaDeviceEnablePeerAccess(peer_device, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return;
  }
  check(status, "cudaDeviceEnablePeerAccess");
}

std::array<char, 32> bus_id_of(int device) {
  std::array<char, 32> id{};
  check(cudaDeviceGetPCIBusId(id.data(), static_cast<int>(id.size()), device),
        "cudaDeviceGetPCIBusId");
  return id;
}

}  // namespace

bool ipc_reachable(Communicator& comm) {
  const int me = comm.rank();
  // Every rank decides these two alike without a collective: with ranks on two hosts, each rank
  // has a peer on another host.
  if (comm.size() > kMaxRanks) return false;
  for (int r = 0; r < comm.size(); ++r) {
    if (!comm.same_host(r, me)) return false;
  }
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  const std::array<char, 32> mine = bus_id_of(device);
  std::vector<std::array<char, 32>> all(static_cast<size_t>(comm.size()));
  comm.all_gather(mine.data(), mine.size(), all.data());
  int ok = 1;
  for (int r = 0; r < comm.size(); ++r) {
    if (r == me) continue;
    int peer_device = -1;
    if (cudaDeviceGetByPCIBusId(&peer_device, all[static_cast<size_t>(r)].data()) != cudaSuccess) {
      cudaGetLastError();  // not visible here: the IPC mapping enables peer access lazily
      continue;
    }
    int can_access = peer_device == device ? 1 : 0;
    if (!can_access) {
      check(cudaDeviceCanAccessPeer(&can_access, device, peer_device), "cudaDeviceCanAccessPeer");
    }
    ok &= can_access != 0 ? 1 : 0;
  }
  std::vector<int> oks(static_cast<size_t>(comm.size()));
  comm.all_gather(&ok, sizeof ok, oks.data());
  for (int o : oks) ok &= o;
  return ok != 0;
}

IpcBuffers::IpcBuffers(Communicator& comm, size_t bytes)
    : comm_(comm), bytes_(bytes), bases_(static_cast<size_t>(comm.size()), nullptr) {
  const int me = comm.rank();
  for (int r = 0; r < comm.size(); ++r) {
    if (!comm.same_host(r, me)) {
      fail(
          "CUDA IPC: rank {} is on another host than rank {}; the low-latency GPU path runs on "
          "one host (use the high-throughput path through NCCL across hosts)",
          r, me);
    }
  }
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  void* local = nullptr;
  check(cudaMalloc(&local, bytes), "cudaMalloc (IPC buffers)");
  bases_[static_cast<size_t>(me)] = local;
  // Zeroed and complete before the all-gather below lets any peer map it.
  check(cudaMemset(local, 0, bytes), "cudaMemset (IPC buffers)");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  Announcement mine{};
  check(cudaIpcGetMemHandle(&mine.handle, local), "cudaIpcGetMemHandle");
  mine.bytes = bytes;
  mine.pci_bus_id = bus_id_of(device);
  std::vector<Announcement> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, sizeof mine, all.data());

  for (int r = 0; r < comm.size(); ++r) {
    if (r == me) continue;
    const Announcement& peer = all[static_cast<size_t>(r)];
    if (peer.bytes != bytes) {
      fail(
          "CUDA IPC: rank {} allocated {} bytes and rank {} {}; every rank must use the same "
          "shape and capacity",
          r, peer.bytes, me, bytes);
    }
    enable_peer_access(device, peer, r);
    void* mapped = nullptr;
    check(cudaIpcOpenMemHandle(&mapped, peer.handle, cudaIpcMemLazyEnablePeerAccess),
          "cudaIpcOpenMemHandle");
    bases_[static_cast<size_t>(r)] = mapped;
  }
}

IpcBuffers::~IpcBuffers() {
  // Nothing to report from a destructor; the order is what matters.
  cudaDeviceSynchronize();
  const int me = comm_.rank();
  for (int r = 0; r < comm_.size(); ++r) {
    if (r != me && bases_[static_cast<size_t>(r)] != nullptr) {
      cudaIpcCloseMemHandle(bases_[static_cast<size_t>(r)]);
    }
  }
  // Peers may still have this allocation mapped (or be writing to it) until they pass here too.
  // A failed communicator cannot synchronize; the process is going down then anyway.
  if (!comm_.failed()) {
    try {
      comm_.barrier();
    } catch (const Error&) {
    }
  }
  cudaFree(bases_[static_cast<size_t>(me)]);
}

}  // namespace moe::cuda::ep
