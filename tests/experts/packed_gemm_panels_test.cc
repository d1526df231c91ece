// packed_gemm on a chunk whose input rows outgrow what the driver counts on L2 to keep: it goes
// through k in panels, each over every pair of the item, the sums of every pair kept between
// panels. The k blocks and their order are those of chunks short enough to take k at once, so the
// outputs must be bit for bit the same as with the rows cut into such chunks: gated (SiLU into the
// kernels' input dtype) and plain (scaled f32 rows), for every kernel set this machine runs, one
// and two threads, items of one pair and of several, and a k that is not a multiple of the panel.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "common/random_tensors.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/kernel_sets.h"

namespace moe::testing {
namespace {

// 1600 rows of 512 or 520 bf16 values are 1.6-1.7 MB: more than the driver's 1.5 MiB for rows.
constexpr int64_t kRows = 1600;

// out = packed_gemm(layout of `k` inputs) over one expert's kRows rows, in chunks of at most
// rows_per_pass rows.
Tensor run(const cpu::PackedLayout& layout, const KernelSet& set, int64_t rows_per_pass,
           int threads, uint64_t seed) {
  const Tensor input = random_normal(DType::kBF16, {kRows, layout.k}, seed);
  const int64_t out_columns = layout.gated ? layout.n / 2 : layout.n;
  const Tensor weights = random_normal(DType::kBF16, {layout.n, layout.k}, seed + 1);
  const Tensor scale = random_normal(DType::kF32, {kRows}, seed + 2);
  Tensor packed(DType::kU8, {layout.bytes()});
  cpu::pack_matrices(layout, weights.data<void>(), 1, nullptr, packed.data<void>(), 1);
  const uint8_t* expert = packed.data<uint8_t>();
  std::vector<int32_t> ids(kRows);
  std::iota(ids.begin(), ids.end(), 0);
  const cpu::ExpertRows group{0, static_cast<int32_t>(kRows), ids.data()};

  const DType out_dtype = layout.gated ? set.kernels.tile.a_dtype : DType::kF32;
  Tensor out(out_dtype, {kRows, out_columns});
  poison(out);
  cpu::PackedGemmArgs args;
  args.a = input.data<void>();
  args.a_dtype = DType::kBF16;
  args.layout = layout;
  args.experts = &expert;
  args.out = out.data<void>();
  args.out_dtype = out_dtype;
  if (!layout.gated) args.out_scale = scale.data<float>();
  cpu::PackedGemmWorkspace ws;
  cpu::packed_gemm(args, &group, 1, set.kernels, rows_per_pass, ws, threads);
  return out;
}

TEST(PackedGemmPanels, ChunksWhoseRowsOutgrowL2GiveTheBitsOfShortChunks) {
  // 7 and 8 pairs: one thread's items hold two or more, whose sums wait side by side.
  const cpu::PackedLayout gated = cpu::gated_layout(DType::kBF16, 100, 512);
  const cpu::PackedLayout plain = cpu::plain_layout(DType::kBF16, 256, 520);
  for (const KernelSet& set : runnable_kernel_sets(DType::kBF16)) {
    for (int threads : {1, 2}) {
      for (const cpu::PackedLayout& layout : {gated, plain}) {
        SCOPED_TRACE(set.name + " threads=" + std::to_string(threads) +
                     (layout.gated ? " gated" : " plain"));
        const Tensor panelled = run(layout, set, 2048, threads, 7);
        const Tensor short_chunks = run(layout, set, 64, threads, 7);
        ASSERT_EQ(std::memcmp(panelled.data<void>(), short_chunks.data<void>(), panelled.nbytes()),
                  0);
      }
    }
  }
}

}  // namespace
}  // namespace moe::testing
