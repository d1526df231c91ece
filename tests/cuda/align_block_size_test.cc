// The CUDA align_block_size against the CPU kernel: the same layout entry for entry (the GPU
// kernel is stable too), on random routings with odd sizes, skew, expert maps and bad ids, on each
// path: one block (small batches), a cluster of blocks (Hopper, up to 256 experts) and three
// launches (past 256 experts, or past 8192 pairs on GPUs without clusters).
#include "kernels/cuda/align_block_size.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/random_tensors.h"
#include "cuda/device_tensor.h"
#include "moe/align.h"

namespace moe {
namespace {

using testing::DeviceTensor;

struct AlignCase {
  int64_t num_tokens, top_k, num_experts, block_m;
  bool expert_map, skewed;
  uint64_t seed;
  std::string describe() const {
    return fmt::format("M={} k={} E={} block_m={}{}{} seed {}", num_tokens, top_k, num_experts,
                       block_m, expert_map ? " map" : "", skewed ? " skewed" : "", seed);
  }
};

Tensor random_ids(const AlignCase& c) {
  Tensor ids(DType::kI32, {c.num_tokens, c.top_k});
  std::mt19937_64 rng(c.seed);
  for (int64_t p = 0; p < ids.numel(); ++p) {
    const bool hot = c.skewed && rng() % 2 == 0;
    ids.data<int32_t>()[p] = hot ? 0 : static_cast<int32_t>(rng() % c.num_experts);
  }
  return ids;
}

Tensor random_map(const AlignCase& c) {
  Tensor map(DType::kI32, {c.num_experts});
  int32_t next = 0;
  for (int64_t e = 0; e < c.num_experts; ++e) map.data<int32_t>()[e] = e % 3 == 1 ? -1 : next++;
  return map;
}

class CudaAlign : public testing::GpuTest {};

TEST_F(CudaAlign, MatchesTheCpuLayoutExactly) {
  std::vector<AlignCase> cases = {
      {0, 8, 128, 16, false, false, 1},
      {1, 8, 128, 16, false, false, 2},
      {1, 1, 1, 1, false, false, 3},
      {3, 2, 5, 4, true, false, 4},
      {64, 8, 128, 16, false, false, 5},
      {77, 6, 61, 64, true, true, 6},
      {513, 8, 256, 128, false, true, 7},
      {4096, 8, 128, 64, false, false, 8},
      {1000, 2, 8, 1, false, false, 9},
      {200, 4, 33, 7, true, false, 10},
      // Past one thread block (8192 pairs or 256 experts): count, scan and scatter launches.
      {1024, 8, 256, 64, false, false, 11},
      {1025, 8, 256, 64, true, false, 12},
      {200, 8, 257, 4, false, true, 13},
      {16384, 8, 128, 128, false, false, 14},
      {4096, 8, 256, 256, true, true, 15},
      {9000, 1, 1, 128, false, false, 16},
      {2048, 8, 8192, 16, true, false, 17},
      {3000, 16, 512, 1, false, true, 18},
      {16383, 8, 256, 128, false, false, 19}};
  std::mt19937_64 rng(99);
  for (int i = 0; i < 30; ++i) {
    const int64_t E = 1 + rng() % 300;
    cases.push_back({static_cast<int64_t>(rng() % 700),
                     1 + static_cast<int64_t>(rng() % std::min<int64_t>(E, 8)), E,
                     1 + static_cast<int64_t>(rng() % 130), rng() % 3 == 0, rng() % 4 == 0,
                     static_cast<uint64_t>(100 + i)});
  }
  for (const AlignCase& c : cases) {
    SCOPED_TRACE(c.describe());
    Tensor ids = random_ids(c);
    Tensor map = c.expert_map ? random_map(c) : Tensor();
    const AlignedPairs expected =
        align_block_size(ids, c.num_experts, c.block_m, c.expert_map ? map.view() : TensorView());
    const int64_t pairs = c.num_tokens * c.top_k;
    const int64_t capacity = max_num_pairs_post_padded(pairs, c.num_experts, c.block_m);
    DeviceTensor d_ids(ids), d_map = c.expert_map ? DeviceTensor(map) : DeviceTensor();
    auto sorted = DeviceTensor::empty_like(DType::kI32, {std::max<int64_t>(capacity, 1)});
    auto blocks =
        DeviceTensor::empty_like(DType::kI32, {std::max<int64_t>(capacity / c.block_m, 1)});
    auto total = DeviceTensor::empty_like(DType::kI32, {1});
    auto scratch = DeviceTensor::empty_like(
        DType::kI32, {static_cast<int64_t>(cuda::align_scratch_bytes(pairs, c.num_experts) / 4)});
    const int64_t local = c.expert_map ? (c.num_experts - (c.num_experts + 1) / 3) : c.num_experts;
    cuda::AlignArgs args{d_ids.view().as<int32_t>(),
                         c.expert_map ? d_map.view().as<int32_t>() : nullptr,
                         pairs,
                         c.num_experts,
                         local,
                         c.block_m,
                         sorted.view().as<int32_t>(),
                         blocks.view().as<int32_t>(),
                         total.view().as<int32_t>(),
                         scratch.view().as<int32_t>()};
    cuda::align_block_size(args, nullptr);
    const Tensor got_total = total.to_host();
    ASSERT_EQ(got_total.data<int32_t>()[0], expected.num_pairs_post_padded);
    const Tensor got_sorted = sorted.to_host(), got_blocks = blocks.to_host();
    for (int64_t i = 0; i < expected.num_pairs_post_padded; ++i) {
      ASSERT_EQ(got_sorted.data<int32_t>()[i], expected.sorted_pair_ids[i]) << "entry " << i;
    }
    for (size_t b = 0; b < expected.expert_ids.size(); ++b) {
      ASSERT_EQ(got_blocks.data<int32_t>()[b], expected.expert_ids[b]) << "block " << b;
    }
  }
}

TEST_F(CudaAlign, TinyBatchPathMatchesTheCpu) {
  for (int64_t M : {0, 1, 3, 16}) {
    const AlignCase c{M, 8, 128, 1, false, false, static_cast<uint64_t>(M + 1)};
    Tensor ids = random_ids(c);
    const AlignedPairs expected = align_tiny_batch(ids, c.num_experts);
    DeviceTensor d_ids(ids);
    auto sorted = DeviceTensor::empty_like(DType::kI32, {std::max<int64_t>(M * 8, 1)});
    auto blocks = DeviceTensor::empty_like(DType::kI32, {std::max<int64_t>(M * 8, 1)});
    auto total = DeviceTensor::empty_like(DType::kI32, {1});
    cuda::AlignArgs args{d_ids.view().as<int32_t>(),
                         nullptr,
                         M * 8,
                         128,
                         128,
                         1,
                         sorted.view().as<int32_t>(),
                         blocks.view().as<int32_t>(),
                         total.view().as<int32_t>()};
    cuda::align_tiny_batch(args, nullptr);
    ASSERT_EQ(total.to_host().data<int32_t>()[0], expected.num_pairs_post_padded);
    const Tensor got_sorted = sorted.to_host(), got_blocks = blocks.to_host();
    for (int64_t i = 0; i < expected.num_pairs_post_padded; ++i) {
      EXPECT_EQ(got_sorted.data<int32_t>()[i], expected.sorted_pair_ids[i]);
      EXPECT_EQ(got_blocks.data<int32_t>()[i], expected.expert_ids[i]);
    }
  }
}

TEST_F(CudaAlign, IdsOutOfRangeGetNoSlotAndLeaveOthersAlone) {
  for (const int64_t M : {50, 2000}) {  // 200 pairs: one block; 8000: a cluster on Hopper
    SCOPED_TRACE(fmt::format("M={}", M));
    const AlignCase c{M, 4, 16, 8, false, false, 5};
    const int64_t pairs = M * 4;
    Tensor ids = random_ids(c);
    ids.data<int32_t>()[7] = 16;
    ids.data<int32_t>()[pairs - 9] = -3;
    DeviceTensor d_ids(ids);
    const int64_t capacity = max_num_pairs_post_padded(pairs, 16, 8);
    auto sorted = DeviceTensor::empty_like(DType::kI32, {capacity});
    auto blocks = DeviceTensor::empty_like(DType::kI32, {capacity / 8});
    auto total = DeviceTensor::empty_like(DType::kI32, {1});
    auto scratch = DeviceTensor::empty_like(
        DType::kI32, {static_cast<int64_t>(cuda::align_scratch_bytes(pairs, 16) / 4)});
    cuda::align_block_size(
        {d_ids.view().as<int32_t>(), nullptr, pairs, 16, 16, 8, sorted.view().as<int32_t>(),
         blocks.view().as<int32_t>(), total.view().as<int32_t>(), scratch.view().as<int32_t>()},
        nullptr);
    const int32_t padded = total.to_host().data<int32_t>()[0];
    const Tensor got = sorted.to_host();
    int64_t seen = 0;
    for (int32_t i = 0; i < padded; ++i) {
      const int32_t p = got.data<int32_t>()[i];
      ASSERT_TRUE(p == pairs || (p >= 0 && p < pairs));
      EXPECT_NE(p, 7);
      EXPECT_NE(p, pairs - 9);
      seen += p < pairs;
    }
    EXPECT_EQ(seen, pairs - 2);
  }
}

}  // namespace
}  // namespace moe
