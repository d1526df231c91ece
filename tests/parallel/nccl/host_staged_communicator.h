// A host-memory Communicator that moves its bytes through a device communicator (NCCL): each
// operation copies the send buffer to the device, runs there, and copies the result back in
// wait(). It lets the host-side expert-parallel layer run over NCCL, so the equality tests check
// the NCCL transport end to end; it is a test fixture, not a fast path.
#pragma once

#include <memory>

#include "moe/communicator.h"

namespace moe::testing {

std::unique_ptr<Communicator> make_host_staged_communicator(Communicator& device_comm);

}  // namespace moe::testing
