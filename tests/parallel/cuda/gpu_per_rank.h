// The GPU of this rank for the programs that run under mpirun with one process per GPU of a host:
// the rank's index among its host's ranks. A collective.
#pragma once

#include <optional>

#include "moe/communicator.h"

namespace moe::testing {

// Exit status ctest reports as skipped (SKIP_RETURN_CODE).
inline constexpr int kSkipped = 77;

// The device index of this rank, or nullopt on every rank (rank 0 prints why) unless there are
// at least two ranks and every rank of each host has its own CUDA device.
std::optional<int> gpu_of_this_rank(Communicator& world);

}  // namespace moe::testing
