// The communicators of the GPU expert-parallel test program (made in cuda_ep_test_main.cc): MPI
// for the host side, NCCL on this rank's GPU.
#pragma once

#include "moe/communicator.h"

namespace moe::testing {

Communicator& host_world();
Communicator& nccl_world();

}  // namespace moe::testing
