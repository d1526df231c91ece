// The communicators of the NCCL test program (made in nccl_test_main.cc).
#pragma once

#include "moe/communicator.h"

namespace moe::testing {

Communicator& nccl_world();    // device buffers
Communicator& staged_world();  // host buffers through nccl_world()

}  // namespace moe::testing
