// NCCL for GPUs: the Communicator of moe/communicator.h over NCCL point-to-point operations, in the
// library target moe::nccl (CMake option MOE_WITH_NCCL, on when the CUDA toolkit and nccl.h are
// found). One process per GPU; the NCCL unique id travels through a host communicator (MPI).
//
// The buffers of every operation are device pointers on the communicator's device, and
// operations are enqueued on its stream. wait() polls the stream with the communicator's deadline
// and NCCL's asynchronous error state; past the deadline it aborts the NCCL communicator
// (ncclCommAbort) and throws moe::Error. Every CUDA and NCCL return code is checked.
//
// The bounded all-to-all needs the sizes first on NCCL (a receive must match its send's size):
// it exchanges them, waits for them on the host, then moves the data; it is not overlappable.
#pragma once

#include <memory>

#include "moe/communicator.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*: no CUDA header needed here

namespace moe {

struct NcclOptions {
  // CUDA device of this rank; -1 = the rank's index among its host's ranks (modulo the devices).
  int device = -1;
  // Stream for every operation; null = the communicator creates its own non-blocking stream.
  CUstream_st* stream = nullptr;
};

// CUDA devices this process sees; 0 when there is no driver or device (never throws).
int cuda_device_count();

// A collective over `bootstrap` (any host-memory communicator, e.g. MPI): ranks and hosts are
// bootstrap's, rank 0's ncclUniqueId reaches every rank through bootstrap.all_gather, and the
// NCCL communicator is created with bootstrap's timeout. Throws moe::Error naming the CUDA or
// NCCL call that failed.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap,
                                                     NcclOptions options = {});

}  // namespace moe
