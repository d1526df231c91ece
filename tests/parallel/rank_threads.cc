#include "parallel/rank_threads.h"

#include <exception>
#include <thread>

#include <gtest/gtest.h>

#include "moe/error.h"

namespace moe::testing {

std::vector<std::string> run_rank_threads(int size, const std::function<void(Communicator&)>& body,
                                          RankThreadsOptions options) {
  std::vector<std::unique_ptr<Communicator>> comms =
      make_in_process_group(size, options.ranks_per_host);
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::string> crashes(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    comms[static_cast<size_t>(r)]->set_timeout(options.timeout);
    threads.emplace_back([&, r] {
      try {
        body(*comms[static_cast<size_t>(r)]);
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      } catch (const std::exception& e) {
        crashes[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(crashes[static_cast<size_t>(r)], "") << "rank " << r << " threw a non-moe exception";
  }
  return errors;
}

bool all_ranks_succeeded(const std::vector<std::string>& errors) {
  bool ok = true;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) {
      ADD_FAILURE() << "rank " << r << ": " << errors[r];
      ok = false;
    }
  }
  return ok;
}

}  // namespace moe::testing
