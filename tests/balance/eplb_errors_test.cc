// Bad input to the EPLB functions: a moe::Error that names the argument, never a crash.
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/expect_error.h"

#include "moe/eplb.h"
#include "moe/error.h"

namespace moe {
namespace {

using testing::error_message;
using testing::expect_error;

constexpr EplbConfig kConfig{.num_replicas = 8, .num_groups = 2, .num_nodes = 2, .num_gpus = 4};

TEST(EplbErrors, BadLoads) {
  const std::vector<double> good(12, 1.0);  // 2 layers of 6 experts
  auto with = [&](size_t i, double value) {
    std::vector<double> w = good;
    w[i] = value;
    return w;
  };
  auto run = [](const std::vector<double>& w) { rebalance_experts(w, 2, 6, kConfig); };
  EXPECT_NO_THROW(run(good));
  expect_error([&] { run(with(7, -1)); }, {"weight", ">= 0", "-1", "layer 1, expert 1"});
  expect_error([&] { run(with(0, std::nan(""))); }, {"weight", "finite", "nan"});
  expect_error([&] { run(with(3, std::numeric_limits<double>::infinity())); },
               {"weight", "finite", "inf"});
  expect_error([&] { run(std::vector<double>(11, 1.0)); }, {"weight", "12", "11"});
  const std::vector<int64_t> counts = {1, 2, 3, -4, 5, 6};
  expect_error([&] { rebalance_experts(counts, 1, 6, kConfig); },
               {"weight", "token counts", "-4", "expert 3"});
}

TEST(EplbErrors, BadSizes) {
  const std::vector<double> w(12, 1.0);
  auto run = [&](EplbConfig config, int64_t num_layers = 2, int64_t num_experts = 6) {
    rebalance_experts(
        std::span<const double>(w.data(), static_cast<size_t>(num_layers * num_experts)),
        num_layers, num_experts, config);
  };
  auto config = [](auto change) {
    EplbConfig c = kConfig;
    change(c);
    return c;
  };
  expect_error([&] { run(kConfig, 0); }, {"num_layers", "got 0"});
  expect_error([&] { run(kConfig, 2, 0); }, {"num_logical_experts", "got 0"});
  expect_error([&] { run(config([](EplbConfig& c) { c.num_replicas = 4; })); },
               {"num_replicas", "at least num_logical_experts = 6", "got 4"});
  expect_error([&] { run(config([](EplbConfig& c) { c.num_replicas = 10; })); },
               {"num_replicas", "multiple of num_gpus = 4", "got 10"});
  expect_error([&] { run(config([](EplbConfig& c) { c.num_replicas = 0; })); },
               {"num_replicas", "got 0"});
  expect_error([&] { run(config([](EplbConfig& c) { c.num_gpus = 3; })); },
               {"num_gpus", "multiple of num_nodes = 2", "got 3"});
  expect_error([&] { run(config([](EplbConfig& c) { c.num_gpus = 0; })); }, {"num_gpus", "got 0"});
  expect_error([&] { run(config([](EplbConfig& c) { c.num_nodes = 0; })); },
               {"num_nodes", "got 0"});
  expect_error([&] { run(config([](EplbConfig& c) { c.num_groups = 0; })); },
               {"num_groups", "got 0"});
  expect_error([&] { run(config([](EplbConfig& c) { c.num_groups = 4; })); },
               {"num_groups", "divisor of num_logical_experts = 6", "got 4"});
  expect_error([&] { run(config([](EplbConfig& c) { c.num_gpus = -4; })); },
               {"num_gpus", "got -4"});
}

TEST(EplbErrors, BadPlacements) {
  expect_error(
      [] {
        placement_from_phy2log(std::vector<int32_t>{0, 1, 4, 2}, 1, 4, 2);
      },
      {"phy2log", "[0, 4)", "got 4", "slot 2"});
  expect_error(
      [] {
        placement_from_phy2log(std::vector<int32_t>{0, 1, 1, 2}, 1, 4, 2);
      },
      {"phy2log", "expert 3 has none"});
  expect_error(
      [] {
        placement_from_phy2log(std::vector<int32_t>{0, 1, 2}, 2, 3, 1);
      },
      {"phy2log", "multiple of 2", "got 3"});
  expect_error([] { placement_from_phy2log(std::vector<int32_t>{}, 1, 3, 1); },
               {"phy2log", "got 0"});
  expect_error([] { contiguous_placement(1, 4, 6, 4); }, {"num_replicas", "multiple of num_gpus"});

  const ExpertPlacement good = contiguous_placement(1, 4, 4, 2);
  ExpertPlacement bad_rank = good;
  bad_rank.replica_rank[1] = 1;
  expect_error([&] { plan_expert_movement(good, bad_rank, 1); }, {"target", "replica"});
  ExpertPlacement bad_count = good;
  bad_count.logcnt[0] = 2;
  expect_error([&] { plan_expert_movement(bad_count, good, 1); }, {"current", "logcnt"});
  ExpertPlacement short_table = good;
  short_table.log2phy.pop_back();
  expect_error([&] { gpu_load(short_table, std::vector<double>(4, 1.0)); },
               {"placement", "log2phy"});
  expect_error([&] { gpu_load(good, std::vector<double>(3, 1.0)); }, {"weight", "4", "3"});

  const ExpertPlacement other_gpus = contiguous_placement(1, 4, 4, 4);
  expect_error([&] { plan_expert_movement(good, other_gpus, 1); },
               {"target", "num_gpus", "2", "4"});
  expect_error([&] { plan_expert_movement(good, good, -1); }, {"bytes_per_expert", "-1"});
}

}  // namespace
}  // namespace moe
