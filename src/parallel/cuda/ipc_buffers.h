// One device allocation per rank that every rank of the host can write: allocated once, zeroed,
// its cudaIpcMemHandle all-gathered through a host communicator and opened by every peer.
//
// Lifetime: an exporter may free its memory only after every importer closed its mapping, so the
// destructor closes this rank's mappings of its peers, waits for every rank at a barrier, then
// frees its own allocation. A collective: every rank constructs and destroys it in the same order.
#pragma once

#include <cstddef>
#include <vector>

#include "moe/communicator.h"

namespace moe::cuda::ep {

// Whether IpcBuffers can connect every rank of `comm`: all on this host, at most kMaxRanks, and
// every pair of devices visible here able to access each other peer to peer. A collective (the
// devices' bus ids are all-gathered): every rank gets the same answer.
bool ipc_reachable(Communicator& comm);

class IpcBuffers {
 public:
  // On the current CUDA device: `bytes` (the same on every rank, checked) zeroed before any peer
  // can see it. Throws moe::Error unless every rank of `comm` is on this host and each pair of
  // devices can reach each other, or when a CUDA call fails. `comm` must outlive this object.
  IpcBuffers(Communicator& comm, size_t bytes);
  ~IpcBuffers();
  IpcBuffers(const IpcBuffers&) = delete;
  IpcBuffers& operator=(const IpcBuffers&) = delete;

  size_t bytes() const { return bytes_; }
  // Rank r's allocation as mapped in this process (this rank's own for r == rank).
  void* of_rank(int rank) const { return bases_[static_cast<size_t>(rank)]; }

 private:
  Communicator& comm_;
  size_t bytes_;
  std::vector<void*> bases_;  // [size]; peers' entries are IPC mappings
};

}  // namespace moe::cuda::ep
