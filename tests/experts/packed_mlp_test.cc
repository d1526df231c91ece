// packed_mlp_prefill against packed_gemm twice: the chunks a thread runs whole (gemm1, then gemm2
// from its own copy of the rows) give bit for bit the outputs of the two passes through cache2,
// for every kernel set this machine runs, several thread counts, an intermediate size that is not
// a multiple of the AMX tile depth, and experts of 0, 1 and many rows. cache2 and the thread
// buffers are poisoned first, so a chunk run whole that read cache2, or rows it did not clear,
// would show NaNs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/random_tensors.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/kernel_sets.h"

namespace moe::testing {
namespace {

constexpr int64_t kExperts = 16, kHidden = 48, kIntermediate = 40;

struct MlpCase {
  std::vector<int32_t> ids;  // row ids, expert by expert, shuffled within
  std::vector<cpu::ExpertRows> groups;
  Tensor hidden, scale;  // [rows, H] bf16, [rows] f32
  Tensor packed_w13, packed_w2;
  std::vector<const uint8_t*> w13, w2;
  cpu::PackedLayout up_layout, down_layout;
};

MlpCase make_case(uint64_t seed) {
  MlpCase c;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> rows_per_expert(kExperts);
  for (int32_t& rows : rows_per_expert) rows = static_cast<int32_t>(rng() % 90);
  rows_per_expert[3] = 0;
  rows_per_expert[7] = 1;
  const int32_t total = std::accumulate(rows_per_expert.begin(), rows_per_expert.end(), 0);
  c.ids.resize(static_cast<size_t>(total));
  std::iota(c.ids.begin(), c.ids.end(), 0);
  std::shuffle(c.ids.begin(), c.ids.end(), rng);
  int32_t offset = 0;
  for (int32_t e = 0; e < kExperts; ++e) {
    if (rows_per_expert[e] > 0) c.groups.push_back({e, rows_per_expert[e], c.ids.data() + offset});
    offset += rows_per_expert[e];
  }
  c.hidden = random_normal(DType::kBF16, {total, kHidden}, seed + 1);
  c.scale = random_normal(DType::kF32, {total}, seed + 2);
  c.up_layout = cpu::gated_layout(DType::kBF16, kIntermediate, kHidden);
  c.down_layout = cpu::plain_layout(DType::kBF16, kHidden, kIntermediate);
  const Tensor w13 = random_normal(DType::kBF16, {kExperts, 2 * kIntermediate, kHidden}, seed + 3);
  const Tensor w2 = random_normal(DType::kBF16, {kExperts, kHidden, kIntermediate}, seed + 4);
  c.packed_w13 = Tensor(DType::kU8, {kExperts * c.up_layout.bytes()});
  c.packed_w2 = Tensor(DType::kU8, {kExperts * c.down_layout.bytes()});
  cpu::pack_matrices(c.up_layout, w13.data<void>(), kExperts, nullptr, c.packed_w13.data<void>(),
                     1);
  cpu::pack_matrices(c.down_layout, w2.data<void>(), kExperts, nullptr, c.packed_w2.data<void>(),
                     1);
  for (int64_t e = 0; e < kExperts; ++e) {
    c.w13.push_back(c.packed_w13.data<uint8_t>() + e * c.up_layout.bytes());
    c.w2.push_back(c.packed_w2.data<uint8_t>() + e * c.down_layout.bytes());
  }
  return c;
}

struct MlpArgs {
  cpu::PackedGemmArgs up, down;
};

MlpArgs mlp_args(const MlpCase& c, const cpu::ExpertKernels& kernels, Tensor& cache2,
                 Tensor& cache3) {
  MlpArgs m;
  m.up.a = c.hidden.data<void>();
  m.up.a_dtype = DType::kBF16;
  m.up.layout = c.up_layout;
  m.up.experts = c.w13.data();
  m.up.out = cache2.data<void>();
  m.up.out_dtype = kernels.tile.a_dtype;
  m.down.a = cache2.data<void>();
  m.down.a_dtype = kernels.tile.a_dtype;
  m.down.layout = c.down_layout;
  m.down.experts = c.w2.data();
  m.down.out_scale = c.scale.data<float>();
  m.down.out = cache3.data<void>();
  m.down.out_dtype = DType::kF32;
  return m;
}

TEST(PackedMlpPrefill, ChunksRunWholeMatchTwoPassesBitForBit) {
  for (const KernelSet& set : runnable_kernel_sets(DType::kBF16)) {
    for (int threads : {1, 2, 3}) {
      for (int64_t rows_per_pass : {int64_t{256}, int64_t{40}}) {
        SCOPED_TRACE(set.name + " threads=" + std::to_string(threads) +
                     " rows_per_pass=" + std::to_string(rows_per_pass));
        const MlpCase c = make_case(static_cast<uint64_t>(threads * 100 + rows_per_pass));
        const int64_t rows = static_cast<int64_t>(c.ids.size());
        const int64_t num_groups = static_cast<int64_t>(c.groups.size());
        Tensor cache2(set.kernels.tile.a_dtype, {rows, kIntermediate});
        Tensor two_pass(DType::kF32, {rows, kHidden});
        Tensor fused(DType::kF32, {rows, kHidden});

        cpu::PackedGemmWorkspace ws;
        MlpArgs m = mlp_args(c, set.kernels, cache2, two_pass);
        cpu::packed_gemm(m.up, c.groups.data(), num_groups, set.kernels, rows_per_pass, ws,
                         threads);
        cpu::packed_gemm(m.down, c.groups.data(), num_groups, set.kernels, rows_per_pass, ws,
                         threads);

        // Stale NaNs wherever a kernel could read what the fused path forgot to clear (a
        // row's k padding multiplies the weights' zero padding: NaN * 0 shows).
        poison(cache2);
        std::fill(ws.thread_buffers.begin(), ws.thread_buffers.end(), std::nanf(""));
        m = mlp_args(c, set.kernels, cache2, fused);
        std::vector<cpu::ExpertRows> rest;
        cpu::packed_mlp_prefill(m.up, m.down, c.groups.data(), num_groups, set.kernels,
                                rows_per_pass, ws, threads, rest);
        const size_t chunks = ws.chunks.size();
        EXPECT_LT(rest.size(), chunks) << "no chunk ran whole";
        cpu::packed_gemm(m.down, rest.data(), static_cast<int64_t>(rest.size()), set.kernels,
                         rows_per_pass, ws, threads);
        ASSERT_EQ(std::memcmp(fused.data<void>(), two_pass.data<void>(), fused.nbytes()), 0);
      }
    }
  }
}

TEST(PackedMlpPrefill, LeavesEveryChunkWhenGemm2DoesNotReadGemm1Rows) {
  const KernelSet set = runnable_kernel_sets(DType::kBF16).front();
  const MlpCase c = make_case(5);
  const int64_t rows = static_cast<int64_t>(c.ids.size());
  Tensor cache2(set.kernels.tile.a_dtype, {rows, kIntermediate});
  Tensor cache3(DType::kF32, {rows, kHidden});
  MlpArgs m = mlp_args(c, set.kernels, cache2, cache3);
  m.down.a_scale = c.scale.data<float>();  // gemm2 would scale the rows it reads
  cpu::PackedGemmWorkspace ws;
  std::vector<cpu::ExpertRows> rest;
  cpu::packed_mlp_prefill(m.up, m.down, c.groups.data(), static_cast<int64_t>(c.groups.size()),
                          set.kernels, 256, ws, 2, rest);
  EXPECT_EQ(rest.size(), ws.chunks.size());
}

}  // namespace
}  // namespace moe::testing
