// Under mpirun every rank runs the same tests. Rank 0 keeps gtest's full report; the other ranks
// would repeat it line for line, so they print only their failures, prefixed by their rank.
// Without this a failure that only rank 1 sees leaves nothing in the log but its exit status.
#pragma once

namespace moe::testing {

// Replaces gtest's printer of this process by one that prints each failed assertion and the name
// of each failed test, prefixed by "rank <rank>". Call between InitGoogleTest and RUN_ALL_TESTS.
void print_only_failures_of_this_rank(int rank);

}  // namespace moe::testing
