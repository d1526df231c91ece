#include "parallel/rank_failure_printer.h"

#include <gtest/gtest.h>

#include <cstdio>

namespace moe::testing {
namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "rank %d: [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                 info.name());
  }

 private:
  int rank_;
};

}  // namespace

void print_only_failures_of_this_rank(int rank) {
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace moe::testing
