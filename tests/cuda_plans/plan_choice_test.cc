// Where CUDA plans come from (ops/cuda_plan_choice.h), on the CPU: the compiled-in tables are
// the repo's files and parse, a tuning folder (argument or MOE_CUDA_TUNING_DIR) replaces them,
// bad folders and files are named in the error, and a tuned plan is used only where it can run;
// on a Hopper GPU also the built-in default's choice among the tma plans.
#include "ops/cuda_plan_choice.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "kernels/cuda/align_block_size.h"
#include "kernels/cuda/decode_experts.h"
#include "kernels/cuda/grouped_gemm.h"
#include "ops/embedded_cuda_plans.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using cuda::ExpertsPlan;
using cuda::GemmKernel;
using cuda_plans::plan_name;
using testing::expect_error;

constexpr const char* kStream16 = R"({"1": {"kernel": "stream", "block_m": 16}})";

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file) << "cannot open " << path;
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// The experts of a small shape, pointers left null: choosing a plan reads none of them.
ExpertsProblem small_problem(int64_t num_tokens, int64_t hidden_size = 64) {
  ExpertsProblem p;
  p.num_tokens = num_tokens;
  p.hidden_size = hidden_size;
  p.intermediate_size = 32;
  p.top_k = 2;
  p.num_experts = 8;
  p.num_local_experts = 8;
  return p;
}

std::string small_table_name(int64_t hidden_size = 64) {
  return cuda_plans::table_file_name("Test GPU", 8, hidden_size, 32, 2);
}

// Each test gets a folder of its own, and leaves MOE_CUDA_TUNING_DIR unset.
class CudaPlanChoice : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::temp_directory_path() / fmt::format("moe_cuda_plans_test_{}_{}", ::getpid(), test);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ::unsetenv(cuda_plans::kTuningDirVariable);
  }
  void TearDown() override {
    ::unsetenv(cuda_plans::kTuningDirVariable);
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  // Writes `text` to `name` in the subfolder `folder` and returns that folder.
  std::string write(const std::string& folder, const std::string& name, const std::string& text) {
    fs::create_directories(dir_ / folder);
    std::ofstream(dir_ / folder / name) << text;
    return (dir_ / folder).string();
  }

  fs::path dir_;
};

TEST_F(CudaPlanChoice, CompiledInTablesAreTheRepoFilesAndParse) {
  std::map<std::string, std::string> on_disk, compiled_in;
  for (const fs::directory_entry& entry : fs::directory_iterator(MOE_CUDA_PLANS_DIR)) {
    if (entry.path().extension() == ".json") {
      on_disk[entry.path().filename().string()] = read_file(entry.path());
    }
  }
  for (const cuda_plans::EmbeddedTable& table : cuda_plans::embedded_tables()) {
    compiled_in[std::string(table.file_name)] = std::string(table.json_text);
  }
  EXPECT_FALSE(compiled_in.empty());
  EXPECT_EQ(compiled_in, on_disk) << "configs/cuda changed without a reconfigure";
  const cuda_plans::PlanTables tables = cuda_plans::load_tables("");
  EXPECT_EQ(tables.size(), on_disk.size());
  for (const auto& [name, table] : tables) EXPECT_FALSE(table.empty()) << name;
}

TEST_F(CudaPlanChoice, FolderTablesReplaceCompiledInOnesOfTheSameName) {
  ASSERT_FALSE(cuda_plans::embedded_tables().empty());
  const std::string replaced(cuda_plans::embedded_tables()[0].file_name);
  write("tuned", replaced, R"({"3": {"kernel": "mma", "block_m": 16}})");
  write("tuned", small_table_name(), kStream16);
  const std::string folder = write("tuned", "notes.txt", "not a table, so not read");

  const cuda_plans::PlanTables tables = cuda_plans::load_tables(folder);
  EXPECT_EQ(tables.size(), cuda_plans::embedded_tables().size() + 1);
  ASSERT_EQ(tables.at(replaced).size(), 1u);
  EXPECT_EQ(plan_name(tables.at(replaced).at(3)), "mma/16");
  EXPECT_EQ(plan_name(tables.at(small_table_name()).at(1)), "stream/16");
}

TEST_F(CudaPlanChoice, TheEnvironmentVariableNamesTheFolder) {
  const ExpertsProblem problem = small_problem(1);
  const std::string folder = write("tuned", small_table_name(), kStream16);
  const std::string untuned = plan_name(cuda::default_plan(problem));
  ASSERT_NE(untuned, "stream/16");

  EXPECT_EQ(plan_name(cuda_plans::choose_plan(problem, "Test GPU")), untuned);
  ASSERT_EQ(::setenv(cuda_plans::kTuningDirVariable, folder.c_str(), 1), 0);
  EXPECT_EQ(plan_name(cuda_plans::choose_plan(problem, "Test GPU")), "stream/16");
  EXPECT_EQ(cuda_plans::current_tables()->count(small_table_name()), 1u);
  ::unsetenv(cuda_plans::kTuningDirVariable);
  EXPECT_EQ(plan_name(cuda_plans::choose_plan(problem, "Test GPU")), untuned);
}

TEST_F(CudaPlanChoice, BadFoldersAndFilesAreNamedInTheError) {
  const std::string missing = (dir_ / "missing").string();
  expect_error([&] { cuda_plans::load_tables(missing); },
               {"tuning folder", missing, "MOE_CUDA_TUNING_DIR", "cannot list"});

  const std::vector<std::string> bad_names = {
      "qwen.json",
      "E=8,H=64,I=32,k=2,device_name=Test GPU.json",
      "E=08,H=64,I=32,k=2,device_name=Test_GPU.json",
      "E=8,H=64,I=32,device_name=Test_GPU.json",
      "E=-8,H=64,I=32,k=2,device_name=Test_GPU.json",
      "E=8,H=64,I=32,k=2,device_name=.json",
      "E=99999999999999999999,H=64,I=32,k=2,device_name=Test_GPU.json"};
  for (size_t i = 0; i < bad_names.size(); ++i) {
    const std::string& name = bad_names[i];
    SCOPED_TRACE(name);
    const std::string folder = write(fmt::format("names{}", i), name, kStream16);
    expect_error([&] { cuda_plans::load_tables(folder); },
                 {(fs::path(folder) / name).string(), "expected a plan table named E=<experts>"});
  }

  const std::string folder =
      write("content", small_table_name(), R"({"1": {"kernel": "cutlass"}})");
  const std::string path = (fs::path(folder) / small_table_name()).string();
  expect_error([&] { cuda_plans::load_tables(folder); }, {path, "\"1.kernel\"", "\"cutlass\""});
  // Through the variable, every call on the GPU would fail the same way until the file is fixed.
  ASSERT_EQ(::setenv(cuda_plans::kTuningDirVariable, folder.c_str(), 1), 0);
  expect_error([&] { cuda_plans::choose_plan(small_problem(1), "Test GPU"); },
               {path, "\"1.kernel\""});
}

TEST(CudaPlanChoiceRules, DefaultTakesTheTinyBatchUpToHalfAPairPerExpert) {
  ExpertsProblem problem = small_problem(1);
  problem.num_experts = problem.num_local_experts = 64;
  for (const int64_t tokens : {1, 2, 16}) {  // k 2: up to 32 pairs over 64 experts
    problem.num_tokens = tokens;
    EXPECT_EQ(plan_name(cuda::default_plan(problem)), "tiny/1") << tokens << " tokens";
  }
  problem.num_tokens = 17;
  EXPECT_NE(plan_name(cuda::default_plan(problem)), "tiny/1");
  problem.num_tokens = 1;
  problem.hidden_size = 60;  // the tiny batch takes any row length
  EXPECT_EQ(plan_name(cuda::default_plan(problem)), "tiny/1");
  problem.hidden_size = 64;
  const int32_t expert_map[64] = {};
  problem.expert_map = expert_map;
  EXPECT_NE(plan_name(cuda::default_plan(problem)), "tiny/1");
}

TEST(CudaPlanChoiceRules, DefaultOnHopperFollowsTheRowsPerExpert) {
  if (!cuda::wgmma_available()) GTEST_SKIP() << "the tma plans are Hopper's";
  // Qwen3-30B-A3B's experts: E 128, k 8, so 16 tokens make one row per expert.
  ExpertsProblem problem = small_problem(1, 2048);
  problem.intermediate_size = 768;
  problem.top_k = 8;
  problem.num_experts = problem.num_local_experts = 128;
  const auto at = [&](int64_t rows_per_expert) {
    problem.num_tokens = rows_per_expert * 16;
    return plan_name(cuda::default_plan(problem));
  };
  EXPECT_EQ(at(56), "tma/64");
  EXPECT_EQ(at(96), "tma/128");
  EXPECT_EQ(at(97), "tma_pair/128");
  EXPECT_EQ(at(448), "tma_pair/128");
  EXPECT_EQ(at(449), "tma/128");
  // Long rows take the ordered walk at every size past the tiny batch.
  problem.hidden_size = 7168;
  EXPECT_EQ(at(56), "tma_dynamic/64");
  EXPECT_EQ(at(192), "tma_dynamic/128");
  EXPECT_EQ(at(1024), "tma_dynamic/128");
}

TEST(CudaPlanChoiceRules, DecodePlanSaysWhatItCannotRun) {
  const ExpertsPlan decode{GemmKernel::kDecode, 1, true};
  ExpertsProblem problem = small_problem(cuda::kDecodeMaxTokens + 1);
  EXPECT_NE(cuda::why_plan_cannot_run(decode, problem).find("at most 8 tokens"), std::string::npos);
  problem.num_tokens = 2;
  EXPECT_EQ(cuda::why_plan_cannot_run(decode, problem), "");
  problem.hidden_size = 60;
  EXPECT_NE(cuda::why_plan_cannot_run(decode, problem).find("multiples of 8"), std::string::npos);
  problem.hidden_size = 64;
  alignas(16) static const uint16_t hidden[8] = {};
  problem.hidden = hidden + 1;  // 2 bytes past a 16-byte boundary
  EXPECT_NE(cuda::why_plan_cannot_run(decode, problem).find("16-byte aligned"), std::string::npos);
  problem.hidden = hidden;
  const int32_t expert_map[8] = {};
  problem.expert_map = expert_map;
  EXPECT_NE(cuda::why_plan_cannot_run(decode, problem).find("expert map"), std::string::npos);
  problem.expert_map = nullptr;
  EXPECT_NE(cuda::why_plan_cannot_run({GemmKernel::kDecode, 1, false}, problem).find("tiny batch"),
            std::string::npos);
}

TEST(CudaPlanChoiceRules, TunedPlansRunOnlyWhereTheyCan) {
  const cuda_plans::PlanTables tables = {
      {small_table_name(),
       cuda_plans::parse_table(R"({"1": {"kernel": "stream", "block_m": 1, "tiny_batch": true},
                                   "8": {"kernel": "stream", "block_m": 4},
                                   "64": {"kernel": "mma", "block_m": 32},
                                   "256": {"kernel": "wgmma", "block_m": 128}})",
                               "small")},
      {small_table_name(60),
       cuda_plans::parse_table(R"({"64": {"kernel": "mma", "block_m": 32}})", "unaligned")}};
  const auto choose = [&](const ExpertsProblem& problem, std::string_view device = "Test GPU") {
    return plan_name(cuda_plans::choose_plan(problem, device, tables));
  };
  const auto untuned = [](const ExpertsProblem& problem) {
    return plan_name(cuda::default_plan(problem));
  };

  EXPECT_EQ(choose(small_problem(1)), "tiny/1");
  EXPECT_EQ(choose(small_problem(10)), "stream/4");
  EXPECT_EQ(choose(small_problem(70)), "mma/32");
  const ExpertsProblem large = small_problem(300);
  EXPECT_EQ(choose(large), cuda::wgmma_available() ? "wgmma/128" : untuned(large));
  EXPECT_EQ(choose(small_problem(10), "Other GPU"), untuned(small_problem(10)));

  // With an expert map the tiny-batch path cannot run: the built-in choice takes over.
  const int32_t expert_map[16] = {};
  ExpertsProblem mapped = small_problem(1);
  mapped.expert_map = expert_map;
  EXPECT_EQ(choose(mapped), untuned(mapped));
  EXPECT_NE(choose(mapped), "tiny/1");

  // Tables are keyed by the experts the weights hold, not by the range of the ids.
  mapped.num_tokens = 10;
  mapped.num_experts = 16;
  EXPECT_EQ(choose(mapped), "stream/4");

  // The tensor-core kernels need H % 8 == 0, whatever the table says.
  const ExpertsProblem unaligned = small_problem(64, 60);
  EXPECT_EQ(choose(unaligned), untuned(unaligned));
  EXPECT_NE(choose(unaligned), "mma/32");

  // And rows that start on 16-byte boundaries: hidden or a weight tensor one element past one (a
  // slice) takes the stream kernel, whatever the table or the default rule would pick.
  alignas(16) static const uint16_t rows[16] = {};
  for (const int which : {0, 1, 2}) {
    ExpertsProblem shifted = small_problem(64);
    (which == 0 ? shifted.hidden : which == 1 ? shifted.w13 : shifted.w2) = rows + 1;
    SCOPED_TRACE(which);
    EXPECT_EQ(choose(shifted), "stream/16");
    EXPECT_EQ(untuned(shifted), "stream/16");
    EXPECT_NE(cuda::why_plan_cannot_run({GemmKernel::kMma, 32, false}, shifted)
                  .find("16-byte aligned hidden and weights"),
              std::string::npos);
    EXPECT_EQ(cuda::why_plan_cannot_run({GemmKernel::kStream, 16, false}, shifted), "");
  }
}

TEST(CudaPlanChoiceRules, AlignedPlansTakeAtMostTheExpertsAlignTakes) {
  ExpertsProblem problem = small_problem(64);
  problem.num_experts = cuda::kMaxAlignExperts;
  EXPECT_EQ(cuda::why_plan_cannot_run({GemmKernel::kStream, 16, false}, problem), "");
  problem.num_experts = cuda::kMaxAlignExperts + 1;
  for (const ExpertsPlan& plan :
       {ExpertsPlan{GemmKernel::kStream, 16, false}, ExpertsPlan{GemmKernel::kMma, 32, false}}) {
    EXPECT_NE(cuda::why_plan_cannot_run(plan, problem).find("at most 8192 experts; got 8193"),
              std::string::npos)
        << plan_name(plan);
  }
  // The tiny batch aligns nothing (and is the default here: 128 pairs over 8193 experts).
  EXPECT_EQ(plan_name(cuda::default_plan(problem)), "tiny/1");
  EXPECT_EQ(cuda::why_plan_cannot_run({GemmKernel::kStream, 1, true}, problem), "");
}

}  // namespace
}  // namespace moe
