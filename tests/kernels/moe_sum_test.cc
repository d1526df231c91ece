// The CPU sum stage (kernels/cpu/moe_sum.h) against a plain loop that adds each token's k rows in
// ascending j, then the shared row, in f32 and rounds once: bit for bit, for f32 and bf16 rows,
// read from one [pairs, width] buffer or through a pointer per pair (rows in another order and
// further apart than width, as expert parallelism's combine leaves them), every output dtype,
// widths around the sum's column chunk, with an output poisoned before and a guard after.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/expect_error.h"
#include "common/random_tensors.h"
#include "kernels/cpu/moe_sum.h"
#include "moe/dtype.h"
#include "moe/tensor.h"

namespace moe::testing {
namespace {

constexpr int64_t kGuardBytes = 64;

struct SumCase {
  int64_t num_tokens = 0, top_k = 0, width = 0;
  DType rows_dtype = DType::kF32, out_dtype = DType::kF32;
  bool shared = false, through_pointers = false;
  int num_threads = 1;
  uint64_t seed = 0;

  std::string describe() const {
    return "tokens=" + std::to_string(num_tokens) + " k=" + std::to_string(top_k) +
           " width=" + std::to_string(width) + " rows=" + std::string(dtype_name(rows_dtype)) +
           " out=" + std::string(dtype_name(out_dtype)) + " shared=" + std::to_string(shared) +
           " pointers=" + std::to_string(through_pointers) +
           " threads=" + std::to_string(num_threads) + " seed=" + std::to_string(seed) +
           " (--gtest_filter=MoeSum.*)";
  }
};

void check_sum(const SumCase& c) {
  SCOPED_TRACE(c.describe());
  const int64_t pairs = c.num_tokens * c.top_k, W = c.width;
  // Pair p's row is row (pairs - 1 - p) of `stored`, rows `stride` values apart: in pair order
  // and contiguous when summed from one buffer, reversed and spaced out through the pointers.
  const int64_t stride = c.through_pointers ? W + 3 : W;
  const Tensor stored = random_normal(c.rows_dtype, {std::max<int64_t>(pairs, 1), stride}, c.seed);
  const Tensor shared =
      random_normal(DType::kF32, {std::max<int64_t>(c.num_tokens, 1), W}, c.seed + 1);
  const size_t elem = dtype_size(c.rows_dtype);
  std::vector<const void*> pointers(static_cast<size_t>(pairs));
  const auto row_of = [&](int64_t p) -> const char* {
    const int64_t row = c.through_pointers ? pairs - 1 - p : p;
    return stored.data<char>() + row * stride * static_cast<int64_t>(elem);
  };
  for (int64_t p = 0; p < pairs; ++p) pointers[static_cast<size_t>(p)] = row_of(p);

  std::vector<float> expected(static_cast<size_t>(c.num_tokens * W));
  std::vector<float> widened(static_cast<size_t>(W));
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    float* sum = expected.data() + t * W;
    for (int64_t j = 0; j < c.top_k; ++j) {
      convert_to_f32(row_of(t * c.top_k + j), c.rows_dtype, widened.data(), static_cast<size_t>(W));
      for (int64_t h = 0; h < W; ++h) sum[h] += widened[static_cast<size_t>(h)];
    }
    if (c.shared) {
      for (int64_t h = 0; h < W; ++h) sum[h] += shared.data<float>()[t * W + h];
    }
  }
  const size_t out_elem = dtype_size(c.out_dtype);
  const size_t out_bytes = expected.size() * out_elem;
  std::vector<char> expected_out(out_bytes);
  convert_from_f32(expected.data(), c.out_dtype, expected_out.data(), expected.size());

  std::vector<char> out(out_bytes + kGuardBytes, static_cast<char>(0xff));
  std::memset(out.data() + out_bytes, 0x5a, kGuardBytes);
  cpu::moe_sum(c.through_pointers ? nullptr : stored.data<void>(),
               c.through_pointers ? pointers.data() : nullptr, c.rows_dtype,
               c.shared ? shared.data<float>() : nullptr, c.num_tokens, c.top_k, W, out.data(),
               c.out_dtype, c.num_threads);
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(std::memcmp(out.data() + i * out_elem, expected_out.data() + i * out_elem, out_elem),
              0)
        << "token " << i / static_cast<size_t>(W) << " column " << i % static_cast<size_t>(W)
        << ": expected " << expected[i];
  }
  for (int64_t b = 0; b < kGuardBytes; ++b) {
    ASSERT_EQ(out[out_bytes + static_cast<size_t>(b)], 0x5a) << "guard byte " << b << " written";
  }
}

TEST(MoeSum, MatchesAPlainLoopBitForBit) {
  uint64_t seed = 1;
  for (DType rows_dtype : {DType::kF32, DType::kBF16}) {
    for (DType out_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t width : {1, 7, 16, 33, 512, 513, 1100}) {
        for (int64_t tokens : {0, 1, 5}) {
          for (int64_t top_k : {1, 3}) {
            for (bool through_pointers : {false, true}) {
              SumCase c;
              c.num_tokens = tokens;
              c.top_k = top_k;
              c.width = width;
              c.rows_dtype = rows_dtype;
              c.out_dtype = out_dtype;
              c.shared = seed % 2 == 0;
              c.through_pointers = through_pointers;
              // Two threads in a third of the cases: each spins on the other at its barrier,
              // which costs seconds over a thousand calls when ctest keeps both cores busy.
              c.num_threads = seed % 3 == 0 ? 2 : 1;
              c.seed = seed++;
              ASSERT_NO_FATAL_FAILURE(check_sum(c));
            }
          }
        }
      }
    }
  }
}

TEST(MoeSum, RowsOfAnotherDtypeAreAnError) {
  const std::vector<uint16_t> rows(8);
  std::vector<float> out(8);
  expect_error(
      [&] {
        cpu::moe_sum(rows.data(), nullptr, DType::kF16, nullptr, 1, 1, 8, out.data(), DType::kF32,
                     1);
      },
      {"moe_sum", "f16", "expected f32 or bf16"});
}

}  // namespace
}  // namespace moe::testing
