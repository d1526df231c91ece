// Every experts backend against the reference backend on random problems, plus the properties
// a user relies on: thread-count independence, isolation of bad tokens, clear errors. The cpu
// backend runs each case on every kernel set this machine can run (kernels/kernel_sets.h: the
// supported paths and the emulated ones), and once through the public call, whose path
// MOE_CPU_ISA can force.
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/expect_error.h"
#include "common/random_tensors.h"
#include "experts/experts_case.h"
#include "kernels/cpu/fused_experts.h"
#include "kernels/kernel_sets.h"
#include "moe/error.h"
#include "moe/experts.h"
#include "ops/experts_validation.h"

namespace moe::testing {
namespace {

// Normwise bounds: max |got - ref| / max |ref| over the output.
// f32: every output element is a sum of H products then I products, accumulated in f32 with a
// fixed order; with these sizes (< 200) the rounding error is a few hundred ulps of the largest
// partial sum at worst, far below 1e-5 of the output's magnitude.
// bf16/f16 out: the result is rounded once to 8 (bf16) or 11 (f16) significant bits, a relative
// error of at most 2^-9 (bf16) of the element, hence of max |ref|; intermediates stay f32, except
// that a bf16 layer on the cpu backend keeps cache3 in bf16 (cpu::cache3_dtype): each of a token's
// k pair rows is rounded once before the f32 sum, up to 2^-9 of sum_j |row_j| more, which exceeds
// |out| where the rows cancel. Over this suite the worst bf16 error went from 3.4e-3 to 6.2e-3 with
// that rounding (DeepSeekSizedRouting, top-8): 1e-2 still leaves a factor of 1.6.
double tolerance(DType out_dtype) {
  switch (out_dtype) {
    case DType::kF32:
      return 1e-5;
    case DType::kBF16:
      return 1e-2;
    case DType::kF16:
      return 2e-3;
    // Not output types of fused_experts.
    case DType::kF8E4M3:
    case DType::kF64:
    case DType::kI32:
    case DType::kI8:
    case DType::kU8:
    case DType::kI64:
      break;
  }
  return 0;
}

// Kernels that round their input rows to bf16 (avx512bf16 and amx with bf16 weights) perturb each
// input of gemm1 and gemm2 by up to 2^-8 of itself. A dot product of random-sign terms then errs
// by about 2^-8 / sqrt(3) of its own magnitude, so the normwise error of the two GEMMs together
// stays near 3e-3 (3.8e-3 the largest over this suite's cases, emulated kernels included); the
// bound leaves a factor of 2.5.
constexpr double kBf16InputsBound = 1e-2;

double tolerance(DType out_dtype, bool bf16_inputs) {
  return tolerance(out_dtype) + (bf16_inputs ? kBf16InputsBound : 0.0);
}

// Whether the path the public call picks rounds its inputs to bf16 for these weights.
bool default_path_rounds_to_bf16(DType weight_dtype) {
  const CpuIsa isa = resolve_cpu_isa();
  return weight_dtype == DType::kBF16 && (isa == CpuIsa::kAvx512Bf16 || isa == CpuIsa::kAmx);
}

void expect_close(const Tensor& got, const Tensor& expected, DType dtype, bool bf16_inputs,
                  const std::string& what) {
  SCOPED_TRACE(what);
  const Comparison cmp = compare(got, expected);
  EXPECT_FALSE(cmp.nan_mismatch) << cmp.describe();
  EXPECT_LE(cmp.max_rel_error, tolerance(dtype, bf16_inputs)) << cmp.describe();
}

void expect_matches_reference(const ExpertsCase& c, Backend backend, int num_threads = 0) {
  SCOPED_TRACE(c.describe() + " backend=" + std::string(backend_name(backend)));
  const ExpertsInputs in = make_inputs(c);
  const Tensor expected = run_reference_f32(in);
  const Tensor got = run_backend(in, backend, num_threads);
  const bool bf16_inputs =
      backend != Backend::kReference && default_path_rounds_to_bf16(c.weight_dtype);
  expect_close(got, expected, c.dtype, bf16_inputs, "public call");
}

// The cpu backend on `c`: the public call, then every runnable kernel set.
void expect_cpu_matches_reference(const ExpertsCase& c, int num_threads = 0) {
  SCOPED_TRACE(c.describe());
  const ExpertsInputs in = make_inputs(c);
  const Tensor expected = run_reference_f32(in);
  expect_close(run_backend(in, Backend::kCpu, num_threads), expected, c.dtype,
               default_path_rounds_to_bf16(c.weight_dtype), "public call");
  for (const KernelSet& set : runnable_kernel_sets(c.weight_dtype)) {
    expect_close(run_cpu_kernels(in, set.kernels, num_threads), expected, c.dtype, set.bf16_inputs,
                 "kernels " + set.name);
  }
}

std::vector<ExpertsCase> random_cases() {
  std::vector<ExpertsCase> cases;
  uint64_t seed = 100;
  const int64_t token_counts[] = {0, 1, 2, 3, 5, 12, 31, 64};
  const int64_t expert_counts[] = {1, 3, 7, 8, 33};
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (int64_t M : token_counts) {
    for (int64_t E : expert_counts) {
      ExpertsCase c;
      c.num_tokens = M;
      c.num_experts = E;
      c.top_k = std::min<int64_t>(E, 1 + static_cast<int64_t>(seed % 4));
      c.hidden_size = 15 + static_cast<int64_t>(seed * 7 % 50);  // not multiples of 16
      c.intermediate_size = 9 + static_cast<int64_t>(seed * 11 % 40);
      c.dtype = dtypes[seed % 3];
      c.weight_dtype = dtypes[(seed / 3) % 3];
      c.activation = static_cast<Activation>(seed % 4);
      c.routing = static_cast<Routing>(seed % 3);
      c.biases = seed % 5 == 0;
      c.expert_map = E > 2 && seed % 4 == 1;
      c.shared_intermediate_size = seed % 3 == 0 ? 13 : 0;
      c.shared_gate = seed % 2 == 0;
      c.weight_on_input = c.top_k == 1 && seed % 2 == 1;
      const int64_t block_sizes[] = {0, 1, 4, 16};
      c.block_m = block_sizes[seed % 4];
      c.seed = seed++;
      cases.push_back(c);
    }
  }
  return cases;
}

TEST(FusedExperts, CpuMatchesReferenceOnRandomProblems) {
  for (const ExpertsCase& c : random_cases()) expect_cpu_matches_reference(c);
}

TEST(FusedExperts, CpuMatchesReferenceAtRealisticWidths) {
  // Widths past every vector and tile size, with a decode batch and a prefill-like batch.
  for (int64_t M : {1, 4, 100}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      ExpertsCase c;
      c.num_tokens = M;
      c.hidden_size = 257;
      c.intermediate_size = 130;
      c.num_experts = 16;
      c.top_k = 4;
      c.dtype = c.weight_dtype = dtype;
      c.shared_intermediate_size = 70;
      c.shared_gate = true;
      c.seed = 7 + static_cast<uint64_t>(M);
      expect_cpu_matches_reference(c);
    }
  }
}

TEST(FusedExperts, EveryActivationAndOption) {
  uint64_t seed = 900;
  for (int a = 0; a < 4; ++a) {
    for (bool on_input : {false, true}) {
      for (bool biases : {false, true}) {
        ExpertsCase c;
        c.num_tokens = 9;
        c.num_experts = 6;
        c.top_k = on_input ? 1 : 3;
        c.activation = static_cast<Activation>(a);
        c.weight_on_input = on_input;
        c.biases = biases;
        c.seed = seed++;
        expect_cpu_matches_reference(c);
      }
    }
  }
}

TEST(FusedExperts, OneExpertTakingEveryPair) {
  for (int64_t block_m : {0, 1, 5, 64}) {
    ExpertsCase c;
    c.num_tokens = 77;
    c.num_experts = 5;
    c.top_k = 1;
    c.routing = Routing::kAllToOneExpert;
    c.block_m = block_m;
    c.seed = 31;
    expect_cpu_matches_reference(c);
  }
}

TEST(FusedExperts, ManyRowsPerExpertAcrossBlocksAndPasses) {
  // Skewed routing gives expert 0 most of 300 pairs: several 32-row tile blocks, and with a small
  // block_m several passes over its weights; 1024 takes all rows in one pass.
  for (int64_t block_m : {0, 7, 40, 1024}) {
    for (DType weights : {DType::kBF16, DType::kF32}) {
      ExpertsCase c;
      c.num_tokens = 150;
      c.hidden_size = 70;
      c.intermediate_size = 40;
      c.num_experts = 5;
      c.top_k = 2;
      c.dtype = DType::kBF16;
      c.weight_dtype = weights;
      c.routing = Routing::kSkewed;
      c.block_m = block_m;
      c.seed = 60 + static_cast<uint64_t>(block_m);
      expect_cpu_matches_reference(c);
    }
  }
}

TEST(FusedExperts, ChunksWhoseSumsOutgrowL1RunEachRowBlocksEpilogue) {
  // Every token takes every expert: chunks of 250 rows, whose sums for one pair (250 x 32 f32)
  // outgrow kChunkSumsInL1 (packed_gemm.cc) on every path, so each row block's epilogue follows
  // its last call. Eight such chunks make two threads run prefill, where packed_mlp_prefill's
  // gemm1 epilogue writes its row block into the thread's own rows for gemm2.
  for (Activation activation : {Activation::kSilu, Activation::kGelu}) {
    ExpertsCase c;
    c.num_tokens = 250;
    c.num_experts = 8;
    c.top_k = 8;
    c.hidden_size = 40;
    c.intermediate_size = 24;
    c.dtype = c.weight_dtype = DType::kBF16;
    c.activation = activation;
    c.biases = true;
    c.seed = 95;
    expect_cpu_matches_reference(c, 2);
  }
}

TEST(FusedExperts, Cache3LargeEnoughToBeStreamedPastTheCaches) {
  // Top-8, H = 2048: cache3 is 32 MiB, where gemm2 writes it with non-temporal stores
  // (kStreamedCache3Bytes in fused_experts.cc), at 512 tokens in f32 (an f32 layer) and at 1024
  // in bf16 (a bf16 layer, cpu::cache3_dtype). A small I keeps the reference quick, and f32
  // weights the f32 layer (no emulated bf16 kernel sets to run).
  for (auto [tokens, dtype] : {std::pair{512, DType::kF32}, {1024, DType::kBF16}}) {
    ExpertsCase c;
    c.num_tokens = tokens;
    c.hidden_size = 2048;
    c.intermediate_size = 8;
    c.num_experts = 16;
    c.top_k = 8;
    c.dtype = c.weight_dtype = dtype;
    c.seed = 90;
    expect_cpu_matches_reference(c);
  }
}

// A bf16 layer keeps cache3 in bf16 (cpu::cache3_dtype): each pair's row is gemm2's f32 result
// rounded once to bf16, and the sum adds those rows in f32. The same problem with the hidden
// states widened to f32 feeds the kernels the same values (bf16 widens exactly) and keeps an f32
// cache3, so the bf16 layer's output must be, bit for bit, to_bf16 of the f32 sum over j of
// to_bf16 of that cache3's rows, plus the shared row.
TEST(FusedExperts, Bf16LayerRoundsEachPairRowOnceBeforeTheSum) {
  ASSERT_EQ(cpu::cache3_dtype(DType::kBF16), DType::kBF16);
  ASSERT_EQ(cpu::cache3_dtype(DType::kF32), DType::kF32);
  ASSERT_EQ(cpu::cache3_dtype(DType::kF16), DType::kF32);
  for (DType weights : {DType::kBF16, DType::kF32}) {
    ExpertsCase c;
    c.num_tokens = 13;
    c.hidden_size = 70;
    c.intermediate_size = 40;
    c.num_experts = 7;
    c.top_k = 3;
    c.dtype = DType::kBF16;
    c.weight_dtype = weights;
    c.biases = true;
    c.expert_map = true;
    c.shared_intermediate_size = 20;
    c.shared_gate = true;
    c.seed = 44;
    SCOPED_TRACE(c.describe());
    const ExpertsInputs in = make_inputs(c);
    const int64_t M = c.num_tokens, H = c.hidden_size, k = c.top_k;
    const Tensor hidden_f32 = Tensor::copy_of(in.hidden, DType::kF32);
    Tensor out_f32(DType::kF32, {M, H});
    const ValidatedExperts v = validate_experts(hidden_f32, in.w13, in.w2, in.topk_weights,
                                                in.topk_ids, out_f32, in.options);
    for (const KernelSet& set : runnable_kernel_sets(weights)) {
      SCOPED_TRACE(set.name);
      const Tensor got = run_cpu_kernels(in, set.kernels, 2);
      cpu::ExpertsWorkspace workspace;
      const auto* cache3 = static_cast<const float*>(cpu::routed_pair_outputs(
          v.problem, nullptr, set.kernels, cpu::kDefaultBlockM, workspace, 2, nullptr));
      const float* shared = cpu::shared_expert_outputs(v.problem, nullptr, set.kernels,
                                                       cpu::kDefaultBlockM, workspace, 2, nullptr);
      ASSERT_NE(shared, nullptr);
      for (int64_t t = 0; t < M; ++t) {
        for (int64_t h = 0; h < H; ++h) {
          float sum = 0;
          for (int64_t j = 0; j < k; ++j) sum += to_f32(to_bf16(cache3[(t * k + j) * H + h]));
          sum += shared[t * H + h];
          ASSERT_EQ(got.data<uint16_t>()[t * H + h], to_bf16(sum).bits)
              << "token " << t << " column " << h << ": f32 sum " << sum;
        }
      }
    }
  }
}

TEST(FusedExperts, DeepSeekSizedRouting) {
  // E = 256 experts, top-8: most experts idle at decode sizes, a few shared at prefill sizes.
  for (int64_t M : {1, 3, 64}) {
    for (Routing routing : {Routing::kUniform, Routing::kSkewed}) {
      ExpertsCase c;
      c.num_tokens = M;
      c.hidden_size = 48;
      c.intermediate_size = 24;
      c.num_experts = 256;
      c.top_k = 8;
      c.dtype = c.weight_dtype = DType::kBF16;
      c.routing = routing;
      c.seed = 80 + static_cast<uint64_t>(M);
      expect_cpu_matches_reference(c);
    }
  }
}

TEST(FusedExperts, ReferenceAgreesWithItselfInEveryDtype) {
  // The reference in bf16 must land within bf16 rounding of the reference in f32.
  ExpertsCase c;
  c.num_tokens = 6;
  c.dtype = DType::kBF16;
  c.seed = 5;
  expect_matches_reference(c, Backend::kReference);
}

TEST(FusedExperts, SameBitsForOneAndTwoThreads) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    ExpertsCase c;
    c.num_tokens = 50;
    c.hidden_size = 67;
    c.intermediate_size = 45;
    c.num_experts = 9;
    c.top_k = 3;
    c.dtype = c.weight_dtype = dtype;
    c.shared_intermediate_size = 20;
    c.seed = 77;
    SCOPED_TRACE(c.describe());
    const ExpertsInputs in = make_inputs(c);
    const Tensor one = run_backend(in, Backend::kCpu, 1);
    for (int threads : {2, 3}) {
      const Tensor more = run_backend(in, Backend::kCpu, threads);
      EXPECT_EQ(std::memcmp(one.data<void>(), more.data<void>(), one.nbytes()), 0) << threads;
    }
    for (const KernelSet& set : runnable_kernel_sets(c.weight_dtype)) {
      const Tensor single = run_cpu_kernels(in, set.kernels, 1);
      const Tensor triple = run_cpu_kernels(in, set.kernels, 3);
      EXPECT_EQ(std::memcmp(single.data<void>(), triple.data<void>(), single.nbytes()), 0)
          << set.name;
    }
  }
}

// The first `tokens` tokens of a case's inputs (the weights are shared).
ExpertsInputs first_tokens(const ExpertsInputs& in, int64_t tokens) {
  ExpertsInputs out = in;
  const auto head = [&](const Tensor& t) {
    Tensor part(t.dtype(), {tokens, t.size(1)});
    std::memcpy(part.data<void>(), t.data<void>(), part.nbytes());
    return part;
  };
  out.hidden = head(in.hidden);
  out.topk_ids = head(in.topk_ids);
  out.topk_weights = head(in.topk_weights);
  return out;
}

TEST(FusedExperts, ATokensResultDoesNotDependOnItsBatch) {
  // Skewed routing: in the full batch expert 0 holds dozens of rows (several tile blocks); in the
  // first three tokens alone it holds at most three. gemm1's k of 600 spans three 256-k blocks,
  // which a chunk of that many rows may take at once (tile_kernel.h: whole_k_from_row_blocks).
  ExpertsCase c;
  c.num_tokens = 60;
  c.hidden_size = 600;
  c.intermediate_size = 20;
  c.num_experts = 6;
  c.top_k = 2;
  c.dtype = c.weight_dtype = DType::kBF16;
  c.routing = Routing::kSkewed;
  c.seed = 21;
  const ExpertsInputs full = make_inputs(c);
  const ExpertsInputs few = first_tokens(full, 3);
  const size_t bytes = 3 * static_cast<size_t>(c.hidden_size) * dtype_size(c.dtype);
  for (const KernelSet& set : runnable_kernel_sets(c.weight_dtype)) {
    const Tensor all = run_cpu_kernels(full, set.kernels, 2);
    const Tensor head = run_cpu_kernels(few, set.kernels, 2);
    EXPECT_EQ(std::memcmp(all.data<void>(), head.data<void>(), bytes), 0) << set.name;
  }
}

// Expert parallelism hands gemm1 a pointer per pair instead of hidden[p / k]: rows received from
// other ranks, in any order. Each pair must read exactly its row, on every kernel set.
TEST(FusedExperts, InputRowsThroughPointersGiveTheSameBits) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    ExpertsCase c;
    c.num_tokens = 37;
    c.hidden_size = 75;
    c.intermediate_size = 40;
    c.num_experts = 7;
    c.top_k = 3;
    c.dtype = c.weight_dtype = dtype;
    c.routing = Routing::kSkewed;
    c.seed = 31;
    SCOPED_TRACE(c.describe());
    const ExpertsInputs in = make_inputs(c);
    const int64_t M = c.num_tokens, H = c.hidden_size, k = c.top_k;
    // The tokens' rows in reverse order in another buffer, and each pair's pointer into it.
    const size_t row_bytes = static_cast<size_t>(H) * dtype_size(dtype);
    Tensor reversed(dtype, {M, H});
    for (int64_t t = 0; t < M; ++t) {
      std::memcpy(reversed.data<char>() + (M - 1 - t) * row_bytes,
                  in.hidden.data<char>() + t * row_bytes, row_bytes);
    }
    std::vector<const void*> row_ptrs(static_cast<size_t>(M * k));
    for (int64_t p = 0; p < M * k; ++p) {
      row_ptrs[p] = reversed.data<char>() + (M - 1 - p / k) * row_bytes;
    }
    for (const KernelSet& set : runnable_kernel_sets(c.weight_dtype)) {
      const Tensor direct = run_cpu_kernels(in, set.kernels, 2);
      Tensor through(dtype, {M, H});
      poison(through);
      ValidatedExperts v = validate_experts(in.hidden, in.w13, in.w2, in.topk_weights, in.topk_ids,
                                            through, in.options);
      v.problem.hidden = nullptr;  // every row must come through the pointers
      v.problem.hidden_row_ptrs = row_ptrs.data();
      cpu::ExpertsWorkspace workspace;
      cpu::fused_experts(v.problem, nullptr, set.kernels, cpu::kDefaultBlockM, workspace, 2,
                         nullptr);
      EXPECT_EQ(std::memcmp(direct.data<void>(), through.data<void>(), direct.nbytes()), 0)
          << set.name;
    }
  }
}

TEST(FusedExperts, EveryFmaPathGivesTheSameBits) {
  // avx2 and avx512 (real, or its logic compiled for AVX2) add each output's products in the same
  // order, one fused multiply-add at a time: only their register width differs.
  if (!cpu_isa_supported(CpuIsa::kAvx2)) GTEST_SKIP() << "needs AVX2";
  for (DType weights : {DType::kBF16, DType::kF16, DType::kF32}) {
    ExpertsCase c;
    c.num_tokens = 40;
    c.hidden_size = 75;
    c.intermediate_size = 40;
    c.num_experts = 6;
    c.top_k = 2;
    c.weight_dtype = weights;
    c.routing = Routing::kSkewed;
    c.seed = 17;
    SCOPED_TRACE(c.describe());
    const ExpertsInputs in = make_inputs(c);
    const Tensor avx2 = run_cpu_kernels(in, cpu::expert_kernels(CpuIsa::kAvx2, weights), 2);
    for (const KernelSet& set : runnable_kernel_sets(weights)) {
      if (set.name != "avx512" && set.name != "avx512-logic-on-avx2") continue;
      const Tensor other = run_cpu_kernels(in, set.kernels, 2);
      EXPECT_EQ(std::memcmp(avx2.data<void>(), other.data<void>(), avx2.nbytes()), 0) << set.name;
    }
  }
}

TEST(FusedExperts, NonFiniteHiddenRowChangesNoOtherToken) {
  ExpertsCase c;
  c.num_tokens = 20;
  c.num_experts = 4;
  c.top_k = 2;
  c.shared_intermediate_size = 8;
  c.shared_gate = true;
  c.seed = 3;
  ExpertsInputs in = make_inputs(c);
  const Tensor clean = run_backend(in, Backend::kCpu);
  const int64_t bad_token = 7, H = c.hidden_size;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
    in.hidden.data<float>()[bad_token * H + 3] = bad;
    const Tensor dirty = run_backend(in, Backend::kCpu);
    for (int64_t t = 0; t < c.num_tokens; ++t) {
      if (t == bad_token) continue;
      EXPECT_EQ(std::memcmp(clean.data<float>() + t * H, dirty.data<float>() + t * H,
                            static_cast<size_t>(H) * sizeof(float)),
                0)
          << "token " << t << " changed when token " << bad_token << " got " << bad;
    }
  }
}

// Expects fused_experts to throw moe::Error whose message contains `needle`.
template <typename Mutate>
void expect_mutation_error(const char* needle, Mutate mutate) {
  ExpertsCase c;
  c.num_tokens = 3;
  c.seed = 11;
  ExpertsInputs in = make_inputs(c);
  TensorView hidden = in.hidden, w13 = in.w13, w2 = in.w2, weights = in.topk_weights,
             ids = in.topk_ids;
  Tensor out(DType::kF32, in.hidden.shape());
  TensorView out_view = out;
  ExpertsOptions options = in.options;
  mutate(hidden, w13, w2, weights, ids, out_view, options);
  expect_error([&] { fused_experts(hidden, w13, w2, weights, ids, out_view, options); }, {needle});
}

TEST(FusedExperts, BadInputNamesTheArgument) {
  using V = TensorView;
  using O = ExpertsOptions;
  expect_mutation_error("hidden", [](V& h, V&, V&, V&, V&, V&, O&) { h.shape = {96}; });
  expect_mutation_error("topk_ids", [](V& h, V&, V&, V&, V&, V&, O&) { h.shape = {2, 32}; });
  expect_mutation_error("hidden", [](V& h, V&, V&, V&, V&, V&, O&) { h.dtype = DType::kI32; });
  expect_mutation_error("w13", [](V&, V& w13, V&, V&, V&, V&, O&) { w13.shape[1] = 31; });
  expect_mutation_error("w2", [](V&, V&, V& w2, V&, V&, V&, O&) { w2.dtype = DType::kBF16; });
  expect_mutation_error("topk_ids",
                        [](V&, V&, V&, V&, V& ids, V&, O&) { ids.as<int32_t>()[4] = 8; });
  expect_mutation_error("topk_ids",
                        [](V&, V&, V&, V&, V& ids, V&, O&) { ids.as<int32_t>()[0] = -1; });
  expect_mutation_error("topk_ids",
                        [](V&, V&, V&, V&, V& ids, V&, O&) { ids.dtype = DType::kF32; });
  expect_mutation_error("topk_weights", [](V&, V&, V&, V& w, V&, V&, O&) {
    w.as<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  });
  expect_mutation_error("topk_weights",
                        [](V&, V&, V&, V& w, V&, V&, O&) { w.as<float>()[1] = INFINITY; });
  expect_mutation_error("topk_weights", [](V&, V&, V&, V& w, V&, V&, O&) { w.shape = {3, 1}; });
  expect_mutation_error("out", [](V&, V&, V&, V&, V&, V& out, O&) { out.shape = {2, 32}; });
  expect_mutation_error("block_m", [](V&, V&, V&, V&, V&, V&, O& o) { o.block_m = 5000; });
  expect_mutation_error("expert_map", [](V&, V&, V&, V&, V&, V&, O& o) {
    static int32_t map[8] = {0, 1, 2, 3, 4, 5, 6, 9};
    o.expert_map = TensorView(map, DType::kI32, {8});
  });
  // A value outside the enum (the kernels switch on it without a default), and the clamped
  // SwiGLU's parameters as MoeConfig checks them.
  expect_mutation_error("activation", [](V&, V&, V&, V&, V&, V&, O& o) {
    o.activation = static_cast<Activation>(42);
  });
  expect_mutation_error("swiglu_limit", [](V&, V&, V&, V&, V&, V&, O& o) {
    o.activation = Activation::kClampedSwiglu;
    o.swiglu_limit = std::numeric_limits<float>::quiet_NaN();
  });
  expect_mutation_error("swiglu_alpha", [](V&, V&, V&, V&, V&, V&, O& o) {
    o.activation = Activation::kClampedSwiglu;
    o.swiglu_alpha = INFINITY;
  });
  // More pairs than int32 numbers (the shape alone; no id is read).
  expect_mutation_error("fewer than 2147483647 pairs", [](V&, V&, V&, V& w, V& ids, V&, O&) {
    ids.shape = w.shape = {std::numeric_limits<int32_t>::max(), 1};
  });
}

TEST(FusedExperts, TopKLargerThanExpertCountIsAnError) {
  Tensor hidden = random_normal(DType::kF32, {2, 8}, 1);
  Tensor w13 = random_normal(DType::kF32, {2, 8, 8}, 2);
  Tensor w2 = random_normal(DType::kF32, {2, 8, 4}, 3);
  Tensor ids = Tensor::zeros(DType::kI32, {2, 3});
  Tensor weights = Tensor::zeros(DType::kF32, {2, 3});
  EXPECT_THROW(fused_experts(hidden, w13, w2, weights, ids), Error);
}

}  // namespace
}  // namespace moe::testing
