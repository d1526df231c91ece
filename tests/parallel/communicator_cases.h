// The checks every Communicator implementation passes, written once: each is one rank's part of
// a collective check and reports through gtest. tests/parallel/communicator_test.cc runs them on
// the in-process group (threads), tests/parallel/mpi/ under mpirun.
#pragma once

#include <cstdint>

#include "moe/communicator.h"

namespace moe::testing {

// Random per-peer sizes (some zero), displacements with gaps; every byte checked, gaps untouched.
void check_all_to_all_v(Communicator& comm, uint64_t seed);
// Bounded receives: the sizes that arrived are reported, bytes past them untouched.
void check_all_to_all_bounded(Communicator& comm, uint64_t seed);
// Two operations in flight, waited for in reverse order.
void check_requests_in_flight(Communicator& comm);
void check_all_gather_and_barrier(Communicator& comm);

}  // namespace moe::testing
