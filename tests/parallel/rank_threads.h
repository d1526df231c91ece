// Runs one function per rank of an in-process communicator group, each on its own thread: the
// way every distributed test here exercises the parallel layer without processes.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "moe/communicator.h"

namespace moe::testing {

struct RankThreadsOptions {
  int ranks_per_host = 0;  // 0 = one host
  std::chrono::milliseconds timeout{20000};
};

// Calls body(comm) for every rank of a new group of `size`, all at once; returns each rank's
// moe::Error message, empty when the body returned. Other exceptions fail the current test.
std::vector<std::string> run_rank_threads(int size, const std::function<void(Communicator&)>& body,
                                          RankThreadsOptions options = {});

// True when every entry of run_rank_threads' result is empty; otherwise prints them.
bool all_ranks_succeeded(const std::vector<std::string>& errors);

}  // namespace moe::testing
