// The MPI communicator of the mpirun test programs (made in mpi_test_main.cc).
#pragma once

#include "moe/communicator.h"

namespace moe::testing {

Communicator& mpi_world();

}  // namespace moe::testing
