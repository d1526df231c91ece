// fused_experts on the GPU against the reference backend (f64 loops on the same bf16 inputs):
// relative error under 1e-2 for every plan (stream kernel at each row count, tensor cores at
// each tile height, the tiny-batch path), over random shapes, skew, expert maps and M = 0, 1.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "common/expect_error.h"
#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "experts/experts_case.h"
#include "kernels/cuda/align_block_size.h"
#include "kernels/cuda/decode_experts.h"
#include "kernels/cuda/fused_experts.h"
#include "moe/experts.h"
#include "ops/cuda_plan_table.h"
#include "ops/experts_validation.h"

namespace moe {
namespace {

using testing::DeviceTensor;
using testing::ExpertsCase;
using testing::ExpertsInputs;

constexpr double kBf16Tolerance = 1e-2;

struct OnDevice {
  DeviceTensor hidden, w13, w2, topk_weights, topk_ids, expert_map, out;
  ExpertsOptions options;
};

OnDevice to_device(const ExpertsInputs& in) {
  OnDevice d{DeviceTensor(in.hidden),
             DeviceTensor(in.w13),
             DeviceTensor(in.w2),
             DeviceTensor(in.topk_weights),
             DeviceTensor(in.topk_ids),
             {},
             DeviceTensor::empty_like(in.hidden.dtype(), in.hidden.shape())};
  d.options = in.options;
  if (in.expert_map.defined()) {
    d.expert_map = DeviceTensor(in.expert_map);
    d.options.expert_map = d.expert_map;
  }
  return d;
}

// Runs the case with an explicit plan through the runner (the public call picks the default).
Tensor run_plan(const ExpertsInputs& in, const cuda::ExpertsPlan& plan) {
  OnDevice d = to_device(in);
  ValidatedExperts v =
      validate_experts(d.hidden, d.w13, d.w2, d.topk_weights, d.topk_ids, d.out, d.options);
  cuda::ExpertsRunner runner;
  runner.run(v.problem, plan, nullptr);
  return d.out.to_host();
}

Tensor run_public(const ExpertsInputs& in) {
  OnDevice d = to_device(in);
  fused_experts(d.hidden, d.w13, d.w2, d.topk_weights, d.topk_ids, d.out, d.options);
  return d.out.to_host();
}

ExpertsCase bf16_case(int64_t M, int64_t H, int64_t I, int64_t E, int64_t k, uint64_t seed) {
  ExpertsCase c;
  c.num_tokens = M;
  c.hidden_size = H;
  c.intermediate_size = I;
  c.num_experts = E;
  c.top_k = k;
  c.dtype = DType::kBF16;
  c.weight_dtype = DType::kBF16;
  c.seed = seed;
  return c;
}

std::vector<cuda::ExpertsPlan> plans_for(const ExpertsCase& c) {
  std::vector<cuda::ExpertsPlan> plans = {{cuda::GemmKernel::kStream, 1, false},
                                          {cuda::GemmKernel::kStream, 4, false},
                                          {cuda::GemmKernel::kStream, 16, false}};
  if (c.hidden_size % 8 == 0 && c.intermediate_size % 8 == 0) {
    for (int64_t block_m : {16, 32, 64, 128})
      plans.push_back({cuda::GemmKernel::kMma, block_m, false});
    if (cuda::wgmma_available()) {
      for (const cuda::GemmKernel kernel :
           {cuda::GemmKernel::kWgmma, cuda::GemmKernel::kTma, cuda::GemmKernel::kTmaEager,
            cuda::GemmKernel::kTmaPair, cuda::GemmKernel::kTmaDynamic}) {
        for (int64_t block_m : {16, 64, 128}) {
          if (block_m == 16 && kernel == cuda::GemmKernel::kWgmma) continue;
          plans.push_back({kernel, block_m, false});
        }
      }
    }
  }
  if (!c.expert_map) plans.push_back({cuda::GemmKernel::kStream, 1, true});
  if (!c.expert_map && c.num_tokens <= cuda::kDecodeMaxTokens && c.hidden_size % 8 == 0 &&
      c.intermediate_size % 8 == 0) {
    plans.push_back({cuda::GemmKernel::kDecode, 1, true});
  }
  return plans;
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  const testing::Comparison cmp = testing::compare(got, want);
  EXPECT_FALSE(cmp.nan_mismatch) << what << ": " << cmp.describe();
  EXPECT_LT(cmp.max_rel_error, kBf16Tolerance) << what << ": " << cmp.describe();
}

// Every warp-specialized tma plan at `block_m` on `in`, against the reference's `want`.
void expect_tma_plans_close(const ExpertsInputs& in, const Tensor& want, int64_t block_m) {
  for (const cuda::GemmKernel kernel :
       {cuda::GemmKernel::kTma, cuda::GemmKernel::kTmaEager, cuda::GemmKernel::kTmaPair,
        cuda::GemmKernel::kTmaDynamic}) {
    const cuda::ExpertsPlan plan{kernel, block_m, false};
    expect_close(Tensor::copy_of(run_plan(in, plan), DType::kF32), want,
                 cuda_plans::plan_name(plan));
  }
}

// One runner on routing A, then B, then A again: each call matches the reference and A's bits
// repeat, so nothing a plan keeps between launches (counters) leaks into the next call.
void expect_repeats_through_one_runner(const ExpertsInputs& a, const ExpertsInputs& b,
                                       const cuda::ExpertsPlan& plan) {
  cuda::ExpertsRunner runner;
  auto run = [&](const ExpertsInputs& in) {
    OnDevice d = to_device(in);
    ValidatedExperts v =
        validate_experts(d.hidden, d.w13, d.w2, d.topk_weights, d.topk_ids, d.out, d.options);
    EXPECT_EQ(cuda::why_plan_cannot_run(plan, v.problem), "");
    runner.run(v.problem, plan, nullptr);
    return d.out.to_host();
  };
  const Tensor first = run(a);
  expect_close(Tensor::copy_of(first, DType::kF32), testing::run_reference_f32(a), "A");
  expect_close(Tensor::copy_of(run(b), DType::kF32), testing::run_reference_f32(b), "B");
  const Tensor again = run(a);
  EXPECT_EQ(std::memcmp(first.data<uint16_t>(), again.data<uint16_t>(), first.nbytes()), 0)
      << "A twice differs";
}

class CudaFusedExperts : public testing::GpuTest {};

// The cases every plan must match the reference on, one test each: a sanitizer can then take
// them a process at a time, and a run cut short still leaves each finished case's verdict.
std::vector<ExpertsCase> every_plan_cases() {
  std::vector<ExpertsCase> cases = {
      bf16_case(0, 64, 32, 8, 2, 1),      bf16_case(1, 64, 32, 8, 2, 2),
      bf16_case(1, 2048, 768, 128, 8, 3), bf16_case(5, 40, 24, 7, 3, 4),
      bf16_case(33, 136, 72, 9, 2, 5),    bf16_case(64, 256, 128, 256, 8, 6),
      bf16_case(300, 128, 64, 16, 4, 7),  bf16_case(17, 37, 19, 5, 2, 8),  // odd H and I
      bf16_case(130, 512, 256, 4, 2, 9),
  };
  ExpertsCase skewed = bf16_case(200, 64, 48, 12, 3, 10);
  skewed.routing = testing::Routing::kSkewed;
  ExpertsCase one_expert = bf16_case(150, 64, 32, 6, 1, 11);
  one_expert.routing = testing::Routing::kAllToOneExpert;
  ExpertsCase mapped = bf16_case(90, 96, 40, 12, 4, 12);
  mapped.expert_map = true;
  // More tiles than a GPU has multiprocessors, so each block of the persistent tma kernel walks
  // several and its stage ring wraps across tiles; K (264, 136) and output columns (136, 264)
  // one 8-wide step past a multiple of 64 and 128: tails in every tile dimension.
  ExpertsCase many_tiles = bf16_case(1500, 264, 136, 24, 6, 13);
  ExpertsCase many_tiles_mapped = bf16_case(1100, 264, 136, 24, 6, 14);
  many_tiles_mapped.routing = testing::Routing::kSkewed;
  many_tiles_mapped.expert_map = true;
  // Experts with more blocks than tma_dynamic's runs hold (15): its walk cuts them into 16-block
  // windows, beside experts with a few blocks each.
  ExpertsCase long_segment = bf16_case(2100, 64, 40, 6, 1, 15);
  long_segment.routing = testing::Routing::kAllToOneExpert;
  ExpertsCase long_segments_skewed = bf16_case(1800, 64, 48, 10, 4, 16);
  long_segments_skewed.routing = testing::Routing::kSkewed;
  // I large enough that tma_dynamic/128 copies gemm1's rows into block order first
  // (fused_experts.cc, gather_input_first); H one 8-wide step past a multiple of 64; skewed, and
  // with an expert map.
  ExpertsCase rows_copied = bf16_case(300, 72, 2048, 12, 3, 17);
  rows_copied.routing = testing::Routing::kSkewed;
  ExpertsCase rows_copied_mapped = bf16_case(260, 72, 2056, 10, 4, 18);
  rows_copied_mapped.expert_map = true;
  cases.insert(cases.end(), {skewed, one_expert, mapped, many_tiles, many_tiles_mapped,
                             long_segment, long_segments_skewed, rows_copied, rows_copied_mapped});
  std::mt19937_64 rng(7);
  for (int i = 0; i < 12; ++i) {
    const int64_t E = 1 + rng() % 40;
    ExpertsCase c = bf16_case(rng() % 200, 8 * (1 + rng() % 40), 8 * (1 + rng() % 24), E,
                              1 + rng() % std::min<int64_t>(E, 6), 100 + i);
    c.expert_map = E > 2 && rng() % 3 == 0;
    cases.push_back(c);
  }
  return cases;
}

class CudaFusedExpertsEveryPlan : public testing::GpuTest,
                                  public ::testing::WithParamInterface<size_t> {};

TEST_P(CudaFusedExpertsEveryPlan, MatchesTheReference) {
  const ExpertsCase c = every_plan_cases().at(GetParam());
  SCOPED_TRACE(c.describe());
  const ExpertsInputs in = testing::make_inputs(c);
  const Tensor want = testing::run_reference_f32(in);
  expect_close(Tensor::copy_of(run_public(in), DType::kF32), want, "default plan");
  for (const cuda::ExpertsPlan& plan : plans_for(c)) {
    const std::string what = cuda_plans::plan_name(plan);
    expect_close(Tensor::copy_of(run_plan(in, plan), DType::kF32), want, what);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaFusedExpertsEveryPlan,
                         ::testing::Range<size_t>(0, every_plan_cases().size()));

// The decode plan keeps counters between launches (each launch sets them back to zero); it and the
// tiny batch up to kTinySumMaxTokens tokens (gemm2 and the sum in one launch) add a token's pairs
// in a fixed warp order, the tiny batch in pair order after. One runner, called on routing A, then
// B, then A again, must match the reference each time and give A's bits twice.
TEST_F(CudaFusedExperts, TinyBatchPlansRepeatExactlyThroughOneRunner) {
  const cuda::ExpertsPlan decode{cuda::GemmKernel::kDecode, 1, true};
  const cuda::ExpertsPlan tiny{cuda::GemmKernel::kStream, 1, true};
  std::vector<ExpertsCase> cases;
  for (int64_t M = 1; M <= cuda::kDecodeMaxTokens; ++M) {
    cases.push_back(bf16_case(M, 264, 104, 64, 4, 300 + M));
  }
  cases.push_back(bf16_case(8, 2048, 768, 128, 8, 310));  // Qwen3-30B-A3B's shape
  cases.push_back(bf16_case(8, 72, 40, 256, 16, 311));    // the most pairs
  cases.push_back(bf16_case(3, 8, 8, 5, 5, 312));         // every expert, one 8-wide step
  cases.push_back(bf16_case(2, 72, 40, 256, 16, 314));    // two pairs per warp, one launch
  cases.push_back(bf16_case(1, 30, 21, 9, 3, 315));       // odd H and I, one launch
  ExpertsCase skewed = bf16_case(7, 64, 56, 12, 3, 313);
  skewed.routing = testing::Routing::kSkewed;
  cases.push_back(skewed);
  for (const ExpertsCase& c : cases) {
    SCOPED_TRACE(c.describe());
    ExpertsInputs a = testing::make_inputs(c);
    // Token 0 names its first expert twice: two pairs of one token on the same weights.
    if (c.top_k > 1) a.topk_ids.data<int32_t>()[1] = a.topk_ids.data<int32_t>()[0];
    ExpertsCase other = c;
    other.seed += 1000;
    const ExpertsInputs b = testing::make_inputs(other);
    const bool rows_aligned = c.hidden_size % 8 == 0 && c.intermediate_size % 8 == 0;
    for (const cuda::ExpertsPlan& plan :
         rows_aligned ? std::vector{decode, tiny} : std::vector{tiny}) {
      const std::string what = cuda_plans::plan_name(plan);
      SCOPED_TRACE(what);
      expect_repeats_through_one_runner(a, b, plan);
    }
  }
}

// The tma kernels' short blocks (block_m 16) compute 64 accumulator rows, 48 of them from the
// stage's weights behind the block's rows, and must store none of those: experts with one pair,
// with more pairs than a block holds, skew, an expert map, and more tiles than multiprocessors.
TEST_F(CudaFusedExperts, ShortBlocksMatchTheReference) {
  if (!cuda::wgmma_available()) GTEST_SKIP() << "the tma kernels need an sm_90 GPU";
  ExpertsCase skewed = bf16_case(120, 64, 48, 12, 3, 350);
  skewed.routing = testing::Routing::kSkewed;
  ExpertsCase mapped = bf16_case(90, 96, 40, 12, 4, 351);
  mapped.expert_map = true;
  const std::vector<ExpertsCase> cases = {bf16_case(1, 2048, 768, 128, 8, 352),
                                          bf16_case(40, 264, 136, 6, 3, 353),  // 20 pairs each
                                          bf16_case(700, 264, 136, 24, 6, 354), skewed, mapped};
  for (const ExpertsCase& c : cases) {
    SCOPED_TRACE(c.describe());
    const ExpertsInputs in = testing::make_inputs(c);
    const Tensor want = testing::run_reference_f32(in);
    expect_tma_plans_close(in, want, 16);
  }
}

// Routes every pair anew so that expert e takes exactly counts[e] pairs (their sum 2M, none over
// M): token t keeps the experts at positions t and t + M of the list of pairs by expert, which
// differ. The router weights stay as make_inputs drew them.
void route_exactly(testing::ExpertsInputs& in, const std::vector<int32_t>& counts) {
  std::vector<int32_t> pair_experts;
  for (size_t e = 0; e < counts.size(); ++e) {
    pair_experts.insert(pair_experts.end(), counts[e], static_cast<int32_t>(e));
  }
  const int64_t M = in.topk_ids.size(0);
  ASSERT_EQ(in.topk_ids.size(1), 2);
  ASSERT_EQ(static_cast<int64_t>(pair_experts.size()), 2 * M);
  for (int64_t t = 0; t < M; ++t) {
    in.topk_ids.data<int32_t>()[2 * t] = pair_experts[t];
    in.topk_ids.data<int32_t>()[2 * t + 1] = pair_experts[t + M];
  }
}

// The 128-row plans' experts whose last block holds few rows behind full ones (tails, which
// tma_dynamic/128 merges into the tile before them; the other plans as a check): 1, 32 and
// 33 rows past one or two full blocks, beside experts of exactly one or two blocks, of one pair, of
// none; with output columns and K one 8-wide step past a tile (H 264, I 136), with gemm1's rows
// copied into block order (I 2048), and with few pairs per expert, where gemm2 waits for each of
// gemm1's blocks.
TEST_F(CudaFusedExperts, TailBlocksMatchTheReference) {
  if (!cuda::wgmma_available()) GTEST_SKIP() << "the tma kernels need an sm_90 GPU";
  const std::vector<int32_t> many = {129, 160, 161, 257, 288, 289, 128, 1, 32, 33, 0, 401, 150, 41};
  const std::vector<int32_t> few = {129, 160, 1, 0, 2, 33, 150, 40, 100, 129, 32, 30};
  struct Shape {
    int64_t H, I;
    const std::vector<int32_t>& counts;
    uint64_t seed;
  };
  for (const Shape& shape :
       {Shape{264, 136, many, 370}, Shape{72, 2048, many, 371}, Shape{264, 136, few, 372}}) {
    int64_t pairs = 0;
    for (int32_t count : shape.counts) pairs += count;
    const ExpertsCase c = bf16_case(pairs / 2, shape.H, shape.I,
                                    static_cast<int64_t>(shape.counts.size()), 2, shape.seed);
    SCOPED_TRACE(c.describe());
    ExpertsInputs in = testing::make_inputs(c);
    route_exactly(in, shape.counts);
    const Tensor want = testing::run_reference_f32(in);
    expect_tma_plans_close(in, want, 128);
  }
}

// An expert map may send two experts to one local expert (here 2j and 2j + 1 to j): their blocks
// then follow each other under one local id, a short block among them that is no tail of a full
// one: 40 rows then 20, 100 then 1, 129 then 32 (the 1-row block a tail, the 32-row one not),
// beside a full block then 20 (a tail). tma_dynamic/128 runs first, so that no other plan's
// buffers from this test hold the right values where it would leave rows unwritten.
TEST_F(CudaFusedExperts, TwoExpertsOnOneLocalExpertMatchTheReference) {
  if (!cuda::wgmma_available()) GTEST_SKIP() << "the tma kernels need an sm_90 GPU";
  const std::vector<int32_t> counts = {40, 20, 128, 20, 100, 1, 129, 32, 0, 34};
  int64_t pairs = 0;
  for (int32_t count : counts) pairs += count;
  const auto E = static_cast<int64_t>(counts.size());
  for (const auto& [H, I, seed] : {std::tuple{264, 136, 380}, std::tuple{72, 2048, 381}}) {
    const ExpertsCase c = bf16_case(pairs / 2, H, I, E, 2, seed);
    SCOPED_TRACE(c.describe());
    ExpertsInputs in = testing::make_inputs(c);
    route_exactly(in, counts);
    in.expert_map = Tensor(DType::kI32, {E});
    for (int64_t e = 0; e < E; ++e) in.expert_map.data<int32_t>()[e] = static_cast<int32_t>(e / 2);
    in.options.expert_map = in.expert_map;
    const Tensor want = testing::run_reference_f32(in);
    for (const cuda::GemmKernel kernel :
         {cuda::GemmKernel::kTmaDynamic, cuda::GemmKernel::kTma, cuda::GemmKernel::kTmaEager,
          cuda::GemmKernel::kTmaPair}) {
      const cuda::ExpertsPlan plan{kernel, 128, false};
      expect_close(Tensor::copy_of(run_plan(in, plan), DType::kF32), want,
                   cuda_plans::plan_name(plan));
    }
  }
}

// tma_dynamic takes its tiles from a counter that each launch leaves zero for the next (no memset
// runs before it): one runner on routing A, B, then A again, with more tiles than a GPU has
// multiprocessors and a batch of two chunks, matches the reference each time and gives A's bits
// twice.
TEST_F(CudaFusedExperts, TileCounterPlansRepeatExactlyThroughOneRunner) {
  if (!cuda::wgmma_available()) GTEST_SKIP() << "tma_dynamic needs an sm_90 GPU";
  std::vector<ExpertsCase> cases = {bf16_case(1500, 264, 136, 24, 6, 330),
                                    bf16_case(cuda::kChunkTokens + 7, 64, 40, 16, 2, 331)};
  ExpertsCase skewed = bf16_case(700, 72, 2048, 12, 3, 332);  // gemm1's rows copied at /128
  skewed.routing = testing::Routing::kSkewed;
  cases.push_back(skewed);
  for (const ExpertsCase& c : cases) {
    SCOPED_TRACE(c.describe());
    const ExpertsInputs a = testing::make_inputs(c);
    ExpertsCase other = c;
    other.seed += 1000;
    const ExpertsInputs b = testing::make_inputs(other);
    for (int64_t block_m : {16, 64, 128}) {
      const cuda::ExpertsPlan plan{cuda::GemmKernel::kTmaDynamic, block_m, false};
      SCOPED_TRACE(cuda_plans::plan_name(plan));
      expect_repeats_through_one_runner(a, b, plan);
    }
  }
}

// Up to 128 rows per expert gemm2 reads each block's rows once gemm1's count for that block is
// full (GroupedGemmArgs::block_done), and its last thread block sets the counts back to zero: one
// runner on routing A, B (fewer blocks), then A again matches the reference each time and gives
// A's bits twice. Left at their totals, the counts would let the next call's gemm2 read rows
// gemm1 has not written yet. The 128-row plans read the rows by TMA box; tma_dynamic/128 at I 2048
// copies gemm1's rows into cache3 first and so waits for all of gemm1 instead.
TEST_F(CudaFusedExperts, Gemm2WaitsForEachBlockOfTheSameCall) {
  if (!cuda::wgmma_available()) GTEST_SKIP() << "the tma kernels need an sm_90 GPU";
  ExpertsCase skewed = bf16_case(500, 264, 136, 64, 4, 361);
  skewed.routing = testing::Routing::kSkewed;
  ExpertsCase mapped = bf16_case(300, 72, 40, 48, 6, 362);  // 56 rows per local expert
  mapped.expert_map = true;
  const std::vector<ExpertsCase> cases = {bf16_case(600, 264, 136, 64, 4, 360), skewed, mapped,
                                          bf16_case(200, 72, 2048, 12, 3, 363),
                                          bf16_case(1600, 264, 136, 64, 4, 364)};  // 100 rows
  for (const ExpertsCase& c : cases) {
    SCOPED_TRACE(c.describe());
    const ExpertsInputs a = testing::make_inputs(c);
    ExpertsCase other = c;
    other.num_tokens = c.num_tokens / 3;
    other.seed += 1000;
    const ExpertsInputs b = testing::make_inputs(other);
    for (const cuda::ExpertsPlan& plan :
         std::vector<cuda::ExpertsPlan>{{cuda::GemmKernel::kTma, 16, false},
                                        {cuda::GemmKernel::kTma, 64, false},
                                        {cuda::GemmKernel::kTmaPair, 64, false},
                                        {cuda::GemmKernel::kTmaDynamic, 16, false},
                                        {cuda::GemmKernel::kTmaDynamic, 64, false},
                                        {cuda::GemmKernel::kTma, 128, false},
                                        {cuda::GemmKernel::kTmaEager, 128, false},
                                        {cuda::GemmKernel::kTmaPair, 128, false},
                                        {cuda::GemmKernel::kTmaDynamic, 128, false}}) {
      SCOPED_TRACE(cuda_plans::plan_name(plan));
      expect_repeats_through_one_runner(a, b, plan);
    }
  }
}

// ExpertsRunner::record_timeline, for `moe bench --timeline`: with a tma plan every thread block of
// both GEMMs reports, each ending after it started and within a second of gemm1's first start, and
// the stage marks come in stream order around them; recording changes no output bit; other plans
// report marks only.
TEST_F(CudaFusedExperts, TimelineRecordsEveryThreadBlock) {
  if (!cuda::wgmma_available()) GTEST_SKIP() << "the tma kernels need an sm_90 GPU";
  const ExpertsInputs in = testing::make_inputs(bf16_case(300, 264, 136, 64, 4, 380));
  auto run_recording = [&](const cuda::ExpertsPlan& plan, Tensor& out) {
    OnDevice d = to_device(in);
    ValidatedExperts v =
        validate_experts(d.hidden, d.w13, d.w2, d.topk_weights, d.topk_ids, d.out, d.options);
    cuda::ExpertsRunner runner;
    runner.record_timeline(true);
    runner.run(v.problem, plan, nullptr);
    auto timeline = runner.read_timeline(nullptr);
    out = d.out.to_host();
    return timeline;
  };
  for (const cuda::ExpertsPlan& plan : std::vector<cuda::ExpertsPlan>{
           {cuda::GemmKernel::kTma, 64, false}, {cuda::GemmKernel::kTmaDynamic, 16, false}}) {
    SCOPED_TRACE(cuda_plans::plan_name(plan));
    const Tensor plain = run_plan(in, plan);
    Tensor recorded;
    const auto timeline = run_recording(plan, recorded);
    EXPECT_EQ(std::memcmp(plain.data<uint16_t>(), recorded.data<uint16_t>(), plain.nbytes()), 0);
    std::vector<int> blocks[2];
    double first_start = 1e9, last_end = -1e9;
    for (const auto& span : timeline.spans) {
      ASSERT_TRUE(span.gemm == 1 || span.gemm == 2) << span.gemm;
      blocks[span.gemm - 1].push_back(span.block);
      EXPECT_LE(span.start_us, span.end_us) << "gemm" << span.gemm << " block " << span.block;
      EXPECT_LT(span.end_us, 1e6) << "gemm" << span.gemm << " block " << span.block;
      EXPECT_GE(span.multiprocessor, 0);
      if (span.gemm == 1) first_start = std::min(first_start, span.start_us);
      last_end = std::max(last_end, span.end_us);
    }
    EXPECT_EQ(first_start, 0.0);
    for (std::vector<int>& ids : blocks) {
      ASSERT_FALSE(ids.empty());
      std::sort(ids.begin(), ids.end());
      for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], static_cast<int>(i));
    }
    const auto& m = timeline.marks;
    EXPECT_LE(m.start_us, m.aligned_us);
    EXPECT_LE(m.aligned_us, 0.0);
    EXPECT_TRUE(std::isnan(m.gathered_us)) << "no copy into block order in this plan";
    EXPECT_GE(m.gemm2_done_us, last_end);
    EXPECT_LE(m.gemm2_done_us, m.done_us);
    EXPECT_LT(m.done_us, 1e6);
  }
  Tensor out;
  const auto other = run_recording({cuda::GemmKernel::kMma, 64, false}, out);
  EXPECT_TRUE(other.spans.empty());
  EXPECT_EQ(other.marks.start_us, 0.0);
  EXPECT_LE(other.marks.aligned_us, other.marks.gemm2_done_us);
  EXPECT_LE(other.marks.gemm2_done_us, other.marks.done_us);
}

// What a serving loop does: each routing's call captured once in a CUDA graph, the graphs
// replayed in turn. Every replay must give the bits of the un-captured call: a kernel that
// synchronizes with the host or allocates fails the capture, one that keeps state between
// launches (tile counters, gemm2 started as gemm1's programmatic dependent at up to 64 or 128 rows
// per expert) would drift across replays.
TEST_F(CudaFusedExperts, CapturedGraphsReplayTheUncapturedBits) {
  std::vector<cuda::ExpertsPlan> plans = {{cuda::GemmKernel::kStream, 16, false},
                                          {cuda::GemmKernel::kMma, 64, false},
                                          {cuda::GemmKernel::kStream, 1, true}};
  if (cuda::wgmma_available()) {
    for (const cuda::GemmKernel kernel :
         {cuda::GemmKernel::kTma, cuda::GemmKernel::kTmaPair, cuda::GemmKernel::kTmaDynamic}) {
      for (int64_t block_m : {16, 64, 128}) plans.push_back({kernel, block_m, false});
    }
  }
  // 50 rows per expert (gemm2 behind gemm1), 100 (behind gemm1 where it waits per block), 375
  // (not), and a decode size.
  const std::vector<ExpertsCase> cases = {
      bf16_case(200, 264, 136, 24, 6, 340), bf16_case(400, 264, 136, 24, 6, 343),
      bf16_case(1500, 264, 136, 24, 6, 341), bf16_case(4, 72, 40, 64, 4, 342)};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const ExpertsCase& c : cases) {
    SCOPED_TRACE(c.describe());
    ExpertsCase other = c;
    other.seed += 1000;
    const ExpertsInputs in_a = testing::make_inputs(c), in_b = testing::make_inputs(other);
    const Tensor want_a = testing::run_reference_f32(in_a),
                 want_b = testing::run_reference_f32(in_b);
    std::vector<cuda::ExpertsPlan> case_plans = plans;
    if (c.num_tokens <= cuda::kDecodeMaxTokens) {
      case_plans.push_back({cuda::GemmKernel::kDecode, 1, true});
    }
    for (const cuda::ExpertsPlan& plan : case_plans) {
      SCOPED_TRACE(cuda_plans::plan_name(plan));
      OnDevice a = to_device(in_a), b = to_device(in_b);
      const ValidatedExperts va =
          validate_experts(a.hidden, a.w13, a.w2, a.topk_weights, a.topk_ids, a.out, a.options);
      const ValidatedExperts vb =
          validate_experts(b.hidden, b.w13, b.w2, b.topk_weights, b.topk_ids, b.out, b.options);
      cuda::ExpertsRunner runner;
      runner.run(va.problem, plan, stream);  // sizes the workspace
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const Tensor uncaptured = a.out.to_host();
      expect_close(Tensor::copy_of(uncaptured, DType::kF32), want_a, "A, un-captured");

      cudaGraphExec_t graphs[2] = {};
      const ValidatedExperts* problems[2] = {&va, &vb};
      for (int g = 0; g < 2; ++g) {
        cudaGraph_t graph = nullptr;
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
        runner.run(problems[g]->problem, plan, stream);
        ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
        ASSERT_EQ(cudaGraphInstantiate(&graphs[g], graph, 0), cudaSuccess);
        cudaGraphDestroy(graph);
      }
      const TensorView out_a = a.out;
      for (int replay = 0; replay < 2; ++replay) {
        // A cleared first, so a replay that wrote nothing cannot pass.
        ASSERT_EQ(cudaMemsetAsync(out_a.data, 0, out_a.nbytes(), stream), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(graphs[0], stream), cudaSuccess);
        ASSERT_EQ(cudaGraphLaunch(graphs[1], stream), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const Tensor replayed = a.out.to_host();
        EXPECT_EQ(std::memcmp(uncaptured.data<uint16_t>(), replayed.data<uint16_t>(),
                              uncaptured.nbytes()),
                  0)
            << "replay " << replay << " of A differs from its un-captured call";
      }
      expect_close(Tensor::copy_of(b.out.to_host(), DType::kF32), want_b, "B, replayed");
      for (cudaGraphExec_t graph : graphs) cudaGraphExecDestroy(graph);
    }
  }
  cudaStreamDestroy(stream);
}

// The decode plan runs the tiny batch's items in one launch, adding each output's terms in the
// same order: up to kTinySumMaxTokens tokens (where the tiny batch also adds in warp order) the
// two plans give the same bits, with repeated experts, k above the warp count, I past a multiple of
// the warp's step, and an id out of range (which adds nothing on either).
TEST_F(CudaFusedExperts, DecodePlanGivesTheTinyBatchBits) {
  const std::vector<ExpertsCase> cases = {
      bf16_case(1, 2048, 768, 16, 8, 320),  // Qwen3-30B-A3B's expert shape
      bf16_case(2, 264, 104, 64, 4, 321),  bf16_case(1, 72, 40, 256, 16, 322),
      bf16_case(2, 72, 40, 256, 16, 323),  bf16_case(2, 8, 8, 5, 5, 324),
      bf16_case(1, 64, 2056, 16, 3, 325),
  };
  for (const ExpertsCase& c : cases) {
    SCOPED_TRACE(c.describe());
    ExpertsInputs in = testing::make_inputs(c);
    int32_t* ids = in.topk_ids.data<int32_t>();
    if (c.top_k > 1) ids[1] = ids[0];
    const cuda::ExpertsPlan tiny{cuda::GemmKernel::kStream, 1, true};
    const cuda::ExpertsPlan decode{cuda::GemmKernel::kDecode, 1, true};
    const Tensor decoded = run_plan(in, decode);
    expect_close(Tensor::copy_of(decoded, DType::kF32), testing::run_reference_f32(in), "decode");
    for (const bool bad_id : {false, true}) {
      if (bad_id) ids[c.top_k - 1] = 1000;
      const Tensor want = run_plan(in, tiny), got = run_plan(in, decode);
      EXPECT_EQ(std::memcmp(want.data<uint16_t>(), got.data<uint16_t>(), want.nbytes()), 0)
          << (bad_id ? "with an id out of range" : "");
    }
  }
}

TEST_F(CudaFusedExperts, ChunksLongBatches) {
  // More tokens than one chunk: the second chunk must see its own ids, weights and rows.
  ExpertsCase c = bf16_case(cuda::kChunkTokens + 37, 64, 32, 8, 2, 21);
  const ExpertsInputs in = testing::make_inputs(c);
  expect_close(Tensor::copy_of(run_public(in), DType::kF32), testing::run_reference_f32(in),
               "chunked");
}

TEST_F(CudaFusedExperts, BadIdTouchesOnlyItsToken) {
  // 40 tokens run the default plan; 4 of 64 experts with k 2, the decode plan too; 2 tokens the
  // tiny batch's gemm2 with the sum in one launch.
  for (const int64_t M : {40, 4, 2}) {
    ExpertsCase c = bf16_case(M, 64, 32, M <= 4 ? 64 : 8, 2, 31);
    ExpertsInputs in = testing::make_inputs(c);
    std::vector<std::pair<std::string, Tensor>> clean = {{"default plan", run_public(in)}};
    if (M == 4) clean.emplace_back("decode/1", run_plan(in, {cuda::GemmKernel::kDecode, 1, true}));
    const int64_t bad_token = std::min<int64_t>(3, M - 1);
    in.topk_ids.data<int32_t>()[2 * bad_token + 1] = 1000;  // slot 1: out of range
    for (const auto& [what, before] : clean) {
      const Tensor dirty =
          what == "decode/1" ? run_plan(in, {cuda::GemmKernel::kDecode, 1, true}) : run_public(in);
      for (int64_t t = 0; t < M; ++t) {
        if (t == bad_token) continue;
        EXPECT_EQ(
            std::memcmp(before.data<uint16_t>() + t * 64, dirty.data<uint16_t>() + t * 64, 128), 0)
            << what << ", token " << t;
      }
    }
  }
}

// A device copy of `host` whose data starts one element past a 16-byte boundary, as a slice of a
// larger tensor may.
struct ShiftedCopy {
  explicit ShiftedCopy(const Tensor& host) {
    const size_t element = dtype_size(host.dtype());
    Tensor flat(host.dtype(), {host.numel() + 1});
    std::memcpy(flat.data<char>() + element, host.data<char>(), host.nbytes());
    buffer = DeviceTensor(flat);
    view = buffer.view();
    view.data = static_cast<char*>(view.data) + element;
    view.shape = host.shape();
  }
  DeviceTensor buffer;
  TensorView view;
};

// hidden and the weights off their 16-byte alignment: the tensor-core kernels cannot read them,
// so the call runs the stream kernel (whatever the plan table says), and a tensor-core plan asked
// for by name says why it cannot run before anything is queued.
TEST_F(CudaFusedExperts, RowsOffTheirAlignmentRunTheStreamKernel) {
  const ExpertsInputs in = testing::make_inputs(bf16_case(256, 64, 32, 8, 2, 51));
  const ShiftedCopy hidden(in.hidden), w13(in.w13), w2(in.w2);
  OnDevice d = to_device(in);
  fused_experts(hidden.view, w13.view, w2.view, d.topk_weights, d.topk_ids, d.out, d.options);
  expect_close(Tensor::copy_of(d.out.to_host(), DType::kF32), testing::run_reference_f32(in),
               "rows off their alignment");

  const ValidatedExperts v = validate_experts(hidden.view, w13.view, w2.view, d.topk_weights,
                                              d.topk_ids, d.out, d.options);
  EXPECT_EQ(cuda::default_plan(v.problem).kernel, cuda::GemmKernel::kStream);
  cuda::ExpertsRunner runner;
  testing::expect_error(
      [&] {
        runner.run(v.problem, {cuda::GemmKernel::kMma, 64, false}, nullptr);
      },
      {"plan", "16-byte aligned hidden and weights"});
}

TEST_F(CudaFusedExperts, RejectsBadInputBeforeLaunch) {
  const ExpertsInputs in = testing::make_inputs(bf16_case(4, 64, 32, 8, 2, 41));
  OnDevice d = to_device(in);
  TensorView w2 = d.w2;
  w2.shape[2] = 31;
  testing::expect_error(
      [&] { fused_experts(d.hidden, d.w13, w2, d.topk_weights, d.topk_ids, d.out, d.options); },
      {"w2"});
  testing::expect_error(
      [&] { fused_experts(in.hidden, d.w13, d.w2, d.topk_weights, d.topk_ids, d.out, d.options); },
      {"w13", "GPU"});
  ExpertsOptions gelu = d.options;
  gelu.activation = Activation::kGelu;
  testing::expect_error(
      [&] { fused_experts(d.hidden, d.w13, d.w2, d.topk_weights, d.topk_ids, d.out, gelu); },
      {"SiLU"});
  ExpertsOptions cpu = d.options;
  cpu.backend = Backend::kCpu;
  testing::expect_error(
      [&] { fused_experts(d.hidden, d.w13, d.w2, d.topk_weights, d.topk_ids, d.out, cpu); },
      {"backend"});
  // More experts than align takes on CUDA (an expert map of 8193, the 8 local ones first): said
  // by the plan check, not by a failed launch.
  Tensor wide_map(DType::kI32, {cuda::kMaxAlignExperts + 1});
  for (int64_t e = 0; e < wide_map.numel(); ++e) {
    wide_map.data<int32_t>()[e] = e < 8 ? static_cast<int32_t>(e) : -1;
  }
  const DeviceTensor wide_map_on_device(wide_map);
  ExpertsOptions wide = d.options;
  wide.expert_map = wide_map_on_device;
  testing::expect_error(
      [&] { fused_experts(d.hidden, d.w13, d.w2, d.topk_weights, d.topk_ids, d.out, wide); },
      {"plan", "at most 8192 experts", "8193"});
}

}  // namespace
}  // namespace moe
