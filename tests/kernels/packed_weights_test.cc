// The packed layout, checked against its description written out independently here: where
// every weight lands, that everything else is zero, and that unpacking gives the matrix back.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/random_tensors.h"
#include "kernels/cpu/packed_experts.h"
#include "kernels/cpu/packed_weights.h"

namespace moe::testing {
namespace {

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The source row of column c (0..31) of pair j, or -1, as packed_weights.h describes it.
int64_t expected_row(bool gated, int64_t n, int64_t pair, int64_t c) {
  if (gated) {
    const int64_t i = 16 * pair + c % 16;
    if (i >= n / 2) return -1;
    return c < 16 ? i : n / 2 + i;
  }
  const int64_t row = 32 * pair + c;
  return row < n ? row : -1;
}

// Byte offset of weight (column c of pair j, k index) in one packed matrix.
int64_t expected_byte(DType dtype, int64_t k_dim, int64_t pair, int64_t c, int64_t k) {
  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  const int64_t k_padded = dtype == DType::kBF16 ? round_up(k_dim, 32) : k_dim;
  const int64_t panel_bytes = k_padded * 16 * elem;
  const int64_t panel = 2 * pair + c / 16;
  const int64_t column = c % 16;
  const int64_t within =
      dtype == DType::kBF16 ? ((k / 2) * 16 + column) * 4 + (k % 2) * 2 : (k * 16 + column) * elem;
  return panel * panel_bytes + within;
}

void check_layout(DType dtype, bool gated, int64_t n, int64_t k_dim, int64_t count) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + (gated ? " gated" : " plain") +
               " n=" + std::to_string(n) + " k=" + std::to_string(k_dim));
  const cpu::PackedLayout layout =
      gated ? cpu::gated_layout(dtype, n / 2, k_dim) : cpu::plain_layout(dtype, n, k_dim);
  EXPECT_EQ(layout.num_pairs, gated ? round_up(n / 2, 16) / 16 : round_up(n, 32) / 32);
  const Tensor matrices = random_normal(dtype, {count, n, k_dim}, static_cast<uint64_t>(n * k_dim));
  // Pack matrices count-1, ..., 0: the ids pick the sources.
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int64_t e = 0; e < count; ++e) ids[e] = static_cast<int32_t>(count - 1 - e);
  std::vector<uint8_t> packed(static_cast<size_t>(count * layout.bytes()), 0xcd);
  cpu::pack_matrices(layout, matrices.data<void>(), count, ids.data(), packed.data(), 2);

  const int64_t elem = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t e = 0; e < count; ++e) {
    const uint8_t* matrix = packed.data() + e * layout.bytes();
    const char* source = matrices.data<char>() + ids[e] * n * k_dim * elem;
    std::vector<bool> written(static_cast<size_t>(layout.bytes()), false);
    for (int64_t pair = 0; pair < layout.num_pairs; ++pair) {
      for (int64_t c = 0; c < 32; ++c) {
        const int64_t row = expected_row(gated, n, pair, c);
        if (row < 0) continue;
        for (int64_t k = 0; k < k_dim; ++k) {
          const int64_t at = expected_byte(dtype, k_dim, pair, c, k);
          ASSERT_EQ(std::memcmp(matrix + at, source + (row * k_dim + k) * elem, elem), 0)
              << "matrix " << e << " pair " << pair << " column " << c << " k " << k;
          for (int64_t b = 0; b < elem; ++b) written[at + b] = true;
        }
      }
    }
    for (int64_t b = 0; b < layout.bytes(); ++b) {
      if (!written[b]) {
        ASSERT_EQ(matrix[b], 0) << "padding byte " << b << " of matrix " << e;
      }
    }
    Tensor back(dtype, {n, k_dim});
    cpu::unpack_matrix(layout, matrix, back.data<void>());
    EXPECT_EQ(std::memcmp(back.data<void>(), source, back.nbytes()), 0) << "unpack of " << e;
  }
}

TEST(PackedWeights, EveryWeightLandsWhereTheLayoutSays) {
  for (DType dtype : {DType::kBF16, DType::kF32, DType::kF16}) {
    for (bool gated : {false, true}) {
      // Sizes one below, at and above a panel, a pair and bf16's k multiple.
      for (int64_t n : {2, 30, 32, 34, 64, 66}) {
        for (int64_t k : {1, 31, 32, 33, 70}) check_layout(dtype, gated, n, k, 3);
      }
    }
  }
}

TEST(PackedWeights, PackedExpertsUnpackToTheirSources) {
  ExpertsProblem pb;
  pb.hidden_size = 40;
  pb.intermediate_size = 24;
  pb.num_local_experts = 3;
  pb.weight_dtype = DType::kBF16;
  pb.shared_intermediate_size = 20;
  const Tensor w13 = random_normal(DType::kBF16, {3, 48, 40}, 1);
  const Tensor w2 = random_normal(DType::kBF16, {3, 40, 24}, 2);
  const Tensor shared_w13 = random_normal(DType::kBF16, {40, 40}, 3);
  const Tensor shared_w2 = random_normal(DType::kBF16, {40, 20}, 4);
  pb.w13 = w13.data<void>();
  pb.w2 = w2.data<void>();
  pb.shared_w13 = shared_w13.data<void>();
  pb.shared_w2 = shared_w2.data<void>();
  const cpu::PackedExperts packed = cpu::PackedExperts::pack(pb, 2);
  for (const auto& [name, got, expected] :
       {std::tuple{"w13", packed.unpack_w13(), &w13}, std::tuple{"w2", packed.unpack_w2(), &w2},
        std::tuple{"shared_w13", packed.unpack_shared_w13(), &shared_w13},
        std::tuple{"shared_w2", packed.unpack_shared_w2(), &shared_w2}}) {
    ASSERT_EQ(got.shape(), expected->shape()) << name;
    EXPECT_EQ(std::memcmp(got.data<void>(), expected->data<void>(), got.nbytes()), 0) << name;
  }
  const cpu::PackedExpertsView view = packed.view();
  EXPECT_EQ(view.w13_experts[2] - view.w13_experts[0], 2 * view.w13.bytes());
  EXPECT_EQ(packed.nbytes(), 3 * (view.w13.bytes() + view.w2.bytes()) + view.shared_w13.bytes() +
                                 view.shared_w2.bytes());
}

}  // namespace
}  // namespace moe::testing
