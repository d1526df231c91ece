// The CUDA plan table format (ops/cuda_plan_table.h), on the CPU: plan names and table files
// round-trip, the closest-M lookup against a brute-force search, and every kind of bad file
// rejected with a message naming the file, the entry and the problem.
#include "ops/cuda_plan_table.h"

#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/expect_error.h"

namespace moe {
namespace {

using cuda::ExpertsPlan;
using cuda::GemmKernel;
using cuda_plans::PlanTable;
using testing::expect_error;

// Every plan some kernel can run.
std::vector<ExpertsPlan> all_plans() {
  std::vector<ExpertsPlan> plans = {{GemmKernel::kStream, 1, true}, {GemmKernel::kDecode, 1, true}};
  for (int64_t block_m = 1; block_m <= cuda::kMaxStreamRows; ++block_m) {
    plans.push_back({GemmKernel::kStream, block_m, false});
  }
  for (int64_t block_m : {16, 32, 64, 128}) plans.push_back({GemmKernel::kMma, block_m, false});
  for (int64_t block_m : {64, 128}) plans.push_back({GemmKernel::kWgmma, block_m, false});
  for (int64_t block_m : {64, 128}) plans.push_back({GemmKernel::kTma, block_m, false});
  for (int64_t block_m : {64, 128}) plans.push_back({GemmKernel::kTmaEager, block_m, false});
  for (int64_t block_m : {64, 128}) plans.push_back({GemmKernel::kTmaPair, block_m, false});
  for (int64_t block_m : {64, 128}) plans.push_back({GemmKernel::kTmaDynamic, block_m, false});
  return plans;
}

// Tables compare by plan names: plan_name tells every plan of all_plans apart (checked below).
std::map<int64_t, std::string> names(const PlanTable& table) {
  std::map<int64_t, std::string> out;
  for (const auto& [num_tokens, plan] : table) out[num_tokens] = cuda_plans::plan_name(plan);
  return out;
}

PlanTable parse(const std::string& text) { return cuda_plans::parse_table(text, "test.json"); }

TEST(CudaPlanTable, PlanNamesAreTheBenchNamesAndRoundTrip) {
  EXPECT_EQ(cuda_plans::plan_name({GemmKernel::kStream, 1, true}), "tiny/1");
  EXPECT_EQ(cuda_plans::plan_name({GemmKernel::kStream, 4, false}), "stream/4");
  EXPECT_EQ(cuda_plans::plan_name({GemmKernel::kMma, 32, false}), "mma/32");
  EXPECT_EQ(cuda_plans::plan_name({GemmKernel::kWgmma, 128, false}), "wgmma/128");
  EXPECT_EQ(cuda_plans::plan_name({GemmKernel::kTma, 64, false}), "tma/64");
  EXPECT_EQ(cuda_plans::plan_name({GemmKernel::kTmaEager, 128, false}), "tma_eager/128");
  EXPECT_EQ(cuda_plans::plan_name({GemmKernel::kTmaPair, 64, false}), "tma_pair/64");
  EXPECT_EQ(cuda_plans::plan_name({GemmKernel::kTmaDynamic, 64, false}), "tma_dynamic/64");
  EXPECT_EQ(cuda_plans::plan_name({GemmKernel::kDecode, 1, true}), "decode/1");
  std::set<std::string> seen;
  for (const ExpertsPlan& plan : all_plans()) {
    const std::string name = cuda_plans::plan_name(plan);
    EXPECT_TRUE(seen.insert(name).second) << "two plans named " << name;
    const ExpertsPlan parsed = cuda_plans::parse_plan_name(name);
    EXPECT_EQ(parsed.kernel, plan.kernel) << name;
    EXPECT_EQ(parsed.block_m, plan.block_m) << name;
    EXPECT_EQ(parsed.tiny_batch, plan.tiny_batch) << name;
  }
}

TEST(CudaPlanTable, RejectsPlanNamesNoKernelRuns) {
  for (const char* name : {"stream", "stream/", "/4", "stream/04", "stream/-1", "stream/4x",
                           "cutlass/64", "STREAM/4"}) {
    expect_error([&] { cuda_plans::parse_plan_name(name); },
                 {fmt::format("plan \"{}\"", name), "expected <kernel>/<block_m>"});
  }
  expect_error([] { cuda_plans::parse_plan_name("tiny/2"); }, {"tiny/2", "block_m 1"});
  expect_error([] { cuda_plans::parse_plan_name("decode/4"); }, {"decode/4", "block_m 1"});
  expect_error([] { cuda_plans::parse_plan_name("stream/17"); }, {"stream/17", "[1, 16]"});
  expect_error([] { cuda_plans::parse_plan_name("mma/48"); }, {"mma/48", "16, 32, 64 or 128"});
  expect_error([] { cuda_plans::parse_plan_name("wgmma/32"); }, {"wgmma/32", "64 or 128"});
  expect_error([] { cuda_plans::parse_plan_name("wgmma/256"); }, {"wgmma/256", "64 or 128"});
  expect_error([] { cuda_plans::parse_plan_name("tma/256"); }, {"tma/256", "64 or 128"});
  expect_error([] { cuda_plans::parse_plan_name("tma_eager/32"); }, {"tma_eager/32", "64 or 128"});
  expect_error([] { cuda_plans::parse_plan_name("tma_pair/256"); }, {"tma_pair/256", "64 or 128"});
}

TEST(CudaPlanTable, FileNamesFollowVllm) {
  EXPECT_EQ(cuda_plans::table_file_name("NVIDIA H200", 128, 2048, 768, 8),
            "E=128,H=2048,I=768,k=8,device_name=NVIDIA_H200.json");
  EXPECT_EQ(cuda_plans::table_file_name("GPU a/b", 1, 2, 3, 4),
            "E=1,H=2,I=3,k=4,device_name=GPU_a_b.json");
}

TEST(CudaPlanTable, RandomTablesRoundTripThroughTheirText) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const std::vector<ExpertsPlan> plans = all_plans();
  for (int round = 0; round < 50; ++round) {
    PlanTable table;
    const int entries = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < entries; ++i) {
      const int64_t num_tokens = 1 + static_cast<int64_t>(rng() % 100000);
      table[num_tokens] = plans[rng() % plans.size()];
    }
    const std::string text = cuda_plans::format_table(table);
    EXPECT_EQ(names(parse(text)), names(table)) << text;
  }
}

TEST(CudaPlanTable, ReadsHandWrittenLayoutsAndDefaultsTinyBatchToFalse) {
  const PlanTable table = parse(
      R"({"64":{"block_m":64,"kernel":"mma"},
          "1": {"kernel": "stream", "block_m": 1, "tiny_batch": true},
          "2": {"tiny_batch": true, "block_m": 1, "kernel": "decode"}})");
  EXPECT_EQ(names(table),
            (std::map<int64_t, std::string>{{1, "tiny/1"}, {2, "decode/1"}, {64, "mma/64"}}));
}

TEST(CudaPlanTable, ClosestEntryWinsAndTiesGoToTheLargerCount) {
  const PlanTable table = {{1, {GemmKernel::kStream, 1, true}},
                           {4, {GemmKernel::kStream, 4, false}},
                           {16, {GemmKernel::kMma, 16, false}},
                           {64, {GemmKernel::kWgmma, 64, false}}};
  const std::map<int64_t, std::string> expected = {
      {0, "tiny/1"},  {1, "tiny/1"},    {2, "tiny/1"},  {3, "stream/4"},  {9, "stream/4"},
      {10, "mma/16"}, {40, "wgmma/64"}, {39, "mma/16"}, {64, "wgmma/64"}, {1 << 20, "wgmma/64"}};
  for (const auto& [num_tokens, name] : expected) {
    EXPECT_EQ(cuda_plans::plan_name(cuda_plans::closest_plan(table, num_tokens)), name)
        << "M = " << num_tokens;
  }
}

TEST(CudaPlanTable, ClosestEntryMatchesABruteForceSearch) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(fmt::format("seed {}", seed));
  std::mt19937_64 rng(seed);
  const std::vector<ExpertsPlan> plans = all_plans();
  // Keys drawn from a narrow range so that ties between two keys come up often.
  for (int round = 0; round < 500; ++round) {
    PlanTable table;
    const int entries = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < entries; ++i) {
      table[1 + static_cast<int64_t>(rng() % 40)] = plans[rng() % plans.size()];
    }
    const int64_t num_tokens = static_cast<int64_t>(rng() % 50);
    int64_t best = -1;
    for (const auto& [key, plan] : table) {
      // Keys ascend, so `<=` keeps the larger of two equally close keys.
      if (best < 0 || std::llabs(key - num_tokens) <= std::llabs(best - num_tokens)) best = key;
    }
    EXPECT_EQ(cuda_plans::plan_name(cuda_plans::closest_plan(table, num_tokens)),
              cuda_plans::plan_name(table.at(best)))
        << "M = " << num_tokens << " in " << cuda_plans::format_table(table);
  }
}

TEST(CudaPlanTable, RejectsBadFilesNamingFileEntryAndProblem) {
  struct BadFile {
    const char* text;
    std::vector<std::string> parts;
  };
  const std::string stream4 = R"({"kernel": "stream", "block_m": 4})";
  const std::vector<BadFile> cases = {
      {"{\"1\": ", {"not valid JSON"}},
      {"[1, 2]", {"expected a JSON object keyed by token count", "array"}},
      {"{}", {"the table is empty"}},
      {R"({"0": {"kernel": "stream", "block_m": 4}})", {"key \"0\"", "positive integer"}},
      {R"({"016": {"kernel": "stream", "block_m": 4}})", {"key \"016\"", "leading zeros"}},
      {R"({"many": {"kernel": "stream", "block_m": 4}})", {"key \"many\""}},
      {R"({"4": 5})", {"entry \"4\"", "expected an object", "number 5"}},
      {R"({"4": {"kernel": "cutlass", "block_m": 64}})", {"\"4.kernel\"", "\"cutlass\""}},
      {R"({"4": {"kernel": 1, "block_m": 64}})", {"\"4.kernel\""}},
      {R"({"4": {"block_m": 64}})", {"\"4.kernel\"", "missing"}},
      {R"({"4": {"kernel": "stream"}})", {"\"4.block_m\"", "missing"}},
      {R"({"4": {"kernel": "stream", "block_m": 0}})", {"\"4.block_m\""}},
      {R"({"4": {"kernel": "stream", "block_m": "4"}})", {"\"4.block_m\"", "string"}},
      {R"({"4": {"kernel": "stream", "block_m": 4, "tiny_batch": "yes"}})", {"\"4.tiny_batch\""}},
      {R"({"4": {"kernel": "stream", "block_m": 4, "blockm": 4}})",
       {"entry \"4\"", "unknown field \"blockm\""}},
      {R"({"4": {"kernel": "stream", "block_m": 17}})", {"entry \"4\"", "[1, 16]; got 17"}},
      {R"({"4": {"kernel": "mma", "block_m": 8}})", {"entry \"4\"", "got 8"}},
      {R"({"4": {"kernel": "wgmma", "block_m": 32}})", {"entry \"4\"", "64 or 128; got 32"}},
      {R"({"4": {"kernel": "tma", "block_m": 32}})",
       {"entry \"4\"", "tma", "16, 64 or 128; got 32"}},
      {R"({"4": {"kernel": "tma", "block_m": 1, "tiny_batch": true}})",
       {"entry \"4\"", "tiny-batch"}},
      {R"({"4": {"kernel": "mma", "block_m": 64, "tiny_batch": true}})",
       {"entry \"4\"", "tiny-batch"}},
      {R"({"4": {"kernel": "stream", "block_m": 4, "tiny_batch": true}})",
       {"entry \"4\"", "tiny-batch"}},
      {R"({"4": {"kernel": "decode", "block_m": 2, "tiny_batch": true}})",
       {"entry \"4\"", "tiny-batch", "block_m 2"}},
      {R"({"4": {"kernel": "decode", "block_m": 1}})",
       {"entry \"4\"", "decode kernel runs only with the tiny batch"}},
  };
  for (const BadFile& bad : cases) {
    SCOPED_TRACE(bad.text);
    std::vector<std::string> parts = bad.parts;
    parts.push_back("test.json");
    expect_error([&] { parse(bad.text); }, parts);
  }
}

}  // namespace
}  // namespace moe
