// The gemm epilogues of epilogue_rows.h, as every runnable kernel set compiles them (the bf16
// paths' own builds, the emulated AMX set's, and this file's build standing in for the driver's):
// SiLU against the float64 formula (bounds of gated_activation_test.cc), its bf16 output bit for
// bit against moe::to_bf16 of its own f32 output, the scale epilogue bit for bit against the f32
// product (and moe::to_bf16 of it for bf16 out, streamed or not), and every output row written at
// its id, only up to the width, nothing else touched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "kernels/cpu/epilogue_rows.h"
#include "kernels/kernel_sets.h"
#include "kernels/reference/experts.h"
#include "moe/dtype.h"

namespace moe::testing {
namespace {

constexpr float kPoison = 12345.0f;
constexpr uint16_t kPoisonBits = 0x7bad;

struct Epilogues {
  std::string name;
  cpu::EpilogueRows silu_rows;
  cpu::EpilogueRows scale_rows;
};

std::vector<Epilogues> every_build() {
  // This file's builds at every width an includer uses.
  std::vector<Epilogues> builds = {{"4 lanes", &cpu::silu_rows<4>, &cpu::scale_rows<4>},
                                   {"8 lanes", &cpu::silu_rows<8>, &cpu::scale_rows<8>},
                                   {"16 lanes", &cpu::silu_rows<16>, &cpu::scale_rows<16>}};
  for (const KernelSet& set : runnable_kernel_sets(DType::kBF16)) {
    if (set.kernels.silu_rows) {
      builds.push_back({set.name, set.kernels.silu_rows, set.kernels.scale_rows});
    }
  }
  return builds;
}

// A chunk of `rows` rows whose ids are a shuffled subset of 2 * rows output rows.
struct Chunk {
  std::vector<float> acc;  // [rows, 32]
  std::vector<int32_t> ids;
  std::vector<float> bias;  // [32]
  int64_t out_rows = 0;
};

Chunk random_chunk(int64_t rows, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 4.0f);
  Chunk c;
  c.acc.resize(static_cast<size_t>(rows * cpu::kPairWidth));
  for (float& v : c.acc) v = normal(rng);
  c.bias.resize(cpu::kPairWidth);
  for (float& v : c.bias) v = normal(rng);
  c.out_rows = 2 * rows;
  std::vector<int32_t> all(static_cast<size_t>(c.out_rows));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
  std::shuffle(all.begin(), all.end(), rng);
  c.ids.assign(all.begin(), all.begin() + rows);
  return c;
}

TEST(EpilogueRows, SiluMatchesTheFormulaAndRoundsToBf16LikeToBf16) {
  constexpr int64_t kStride = 40;  // out rows wider than the panel: columns past width untouched
  uint64_t seed = 1;
  for (const Epilogues& build : every_build()) {
    for (int64_t rows : {1, 2, 15, 16, 17, 33}) {
      for (int64_t width : {1, 7, 15, 16}) {
        for (bool with_bias : {false, true}) {
          SCOPED_TRACE(build.name + " rows=" + std::to_string(rows) +
                       " width=" + std::to_string(width) + " bias=" + std::to_string(with_bias) +
                       " seed=" + std::to_string(seed));
          const Chunk c = random_chunk(rows, seed++);
          std::vector<float> out_f32(static_cast<size_t>(c.out_rows * kStride), kPoison);
          std::vector<uint16_t> out_bf16(out_f32.size(), kPoisonBits);
          cpu::EpilogueArgs e;
          e.acc = c.acc.data();
          e.rows = rows;
          e.ids = c.ids.data();
          e.bias = with_bias ? c.bias.data() : nullptr;
          e.width = width;
          e.out_stride = kStride;
          e.out = out_f32.data();
          build.silu_rows(e);
          e.out = out_bf16.data();
          e.out_dtype = DType::kBF16;
          build.silu_rows(e);

          std::vector<bool> written(out_f32.size(), false);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t col = 0; col < width; ++col) {
              const size_t at = static_cast<size_t>(c.ids[r] * kStride + col);
              written[at] = true;
              const float gate = c.acc[r * cpu::kPairWidth + col] + (with_bias ? c.bias[col] : 0);
              const float up = c.acc[r * cpu::kPairWidth + cpu::kPanelWidth + col] +
                               (with_bias ? c.bias[cpu::kPanelWidth + col] : 0);
              const double expected =
                  reference::gated_activation(Activation::kSilu, gate, up, 1.702, 7.0);
              const double bound = 2e-6 * std::abs(expected) + 1e-6 * std::abs(gate * up) + 1e-35;
              ASSERT_LE(std::abs(out_f32[at] - expected), bound)
                  << "row " << r << " column " << col << " got " << out_f32[at] << " expected "
                  << expected;
              ASSERT_EQ(out_bf16[at], to_bf16(out_f32[at]).bits) << "row " << r << " col " << col;
            }
          }
          for (size_t i = 0; i < written.size(); ++i) {
            if (written[i]) continue;
            ASSERT_EQ(out_f32[i], kPoison) << "f32 output element " << i << " touched";
            ASSERT_EQ(out_bf16[i], kPoisonBits) << "bf16 output element " << i << " touched";
          }
        }
      }
    }
  }
}

// The scale epilogue into f32 (T = float) or bf16 (T = uint16_t) rows: each output bit for bit
// the f32 product, or moe::to_bf16 of it. With `stream`, whole rows go through non-temporal stores
// where a row is 16-byte aligned and through a copy where it is not (out_offset 1: 4 bytes off
// for f32, 2 for bf16): the same values either way.
template <typename T>
void check_scale_rows(DType out_dtype, T poison, uint64_t& seed) {
  constexpr int64_t kStride = 48;
  const auto expected_bits = [&](float product) -> T {
    if constexpr (sizeof(T) == sizeof(float)) {
      return product;
    } else {
      return to_bf16(product).bits;
    }
  };
  for (const Epilogues& build : every_build()) {
    for (int64_t rows : {1, 3, 16, 33}) {
      for (int64_t width : {1, 15, 16, 17, 31, 32}) {
        for (auto [with_bias, stream, out_offset] :
             {std::tuple{false, false, 0}, {true, false, 0}, {false, true, 0}, {true, true, 1}}) {
          SCOPED_TRACE(build.name + " out=" + std::string(dtype_name(out_dtype)) +
                       " rows=" + std::to_string(rows) + " width=" + std::to_string(width) +
                       " bias=" + std::to_string(with_bias) + " stream=" + std::to_string(stream) +
                       " out_offset=" + std::to_string(out_offset) +
                       " seed=" + std::to_string(seed));
          const Chunk c = random_chunk(rows, seed++);
          std::vector<float> scale(static_cast<size_t>(c.out_rows));
          for (size_t i = 0; i < scale.size(); ++i) scale[i] = 0.25f + 0.125f * float(i % 7);
          // At out_offset 0 every row is 16-byte aligned (kStride values of either type are a
          // multiple of 16 bytes apart), so stream takes the non-temporal stores.
          alignas(64) T buffer[2 * 33 * kStride + 1];
          std::fill(std::begin(buffer), std::end(buffer), poison);
          const std::span<T> out(buffer + out_offset, static_cast<size_t>(c.out_rows * kStride));
          cpu::EpilogueArgs e;
          e.acc = c.acc.data();
          e.rows = rows;
          e.ids = c.ids.data();
          e.bias = with_bias ? c.bias.data() : nullptr;
          e.scale = scale.data();
          e.width = width;
          e.out = out.data();
          e.out_stride = kStride;
          e.out_dtype = out_dtype;
          e.stream = stream;
          build.scale_rows(e);
          std::vector<bool> written(out.size(), false);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t col = 0; col < width; ++col) {
              const size_t at = static_cast<size_t>(c.ids[r] * kStride + col);
              written[at] = true;
              const float sum = c.acc[r * cpu::kPairWidth + col] + (with_bias ? c.bias[col] : 0);
              ASSERT_EQ(out[at], expected_bits(sum * scale[c.ids[r]]))
                  << "row " << r << " column " << col;
            }
          }
          for (size_t i = 0; i < written.size(); ++i) {
            if (!written[i]) {
              ASSERT_EQ(out[i], poison) << "output element " << i << " touched";
            }
          }
          if (out_offset > 0) {
            ASSERT_EQ(buffer[0], poison) << "the element before out touched";
          }
          for (size_t i = static_cast<size_t>(out_offset) + out.size(); i < std::size(buffer);
               ++i) {
            ASSERT_EQ(buffer[i], poison) << "element " << i << " past out touched";
          }
        }
      }
    }
  }
}

TEST(EpilogueRows, ScaleIsExactAndWritesOnlyItsRows) {
  uint64_t seed = 100;
  check_scale_rows<float>(DType::kF32, kPoison, seed);
}

TEST(EpilogueRows, ScaleRoundsToBf16LikeToBf16AndWritesOnlyItsRows) {
  uint64_t seed = 200;
  check_scale_rows<uint16_t>(DType::kBF16, kPoisonBits, seed);
}

// Rounds `values` (16) kLanes at a time, as the epilogue of that width does.
template <int kLanes>
void check_rounding(const std::vector<float>& values) {
  for (size_t i = 0; i < values.size(); i += kLanes) {
    typename cpu::Lanes<kLanes>::Floats v;
    std::memcpy(&v, values.data() + i, sizeof v);
    uint16_t halves[kLanes];
    cpu::round_to_bf16<kLanes>(v, halves);
    for (int lane = 0; lane < kLanes; ++lane) {
      EXPECT_EQ(halves[lane], to_bf16(values[i + lane]).bits)
          << kLanes << " lanes, value bits " << std::hex << f32_bits(values[i + lane]);
    }
  }
}

TEST(EpilogueRows, RoundToBf16MatchesToBf16OnTiesAndSpecials) {
  const std::vector<uint32_t> bits = {0x3f808000u,  // tie, lower neighbour even: stays
                                      0x3f818000u,  // tie, lower neighbour odd: rounds up
                                      0x3f807fffu,
                                      0x3f808001u,
                                      0x7f7fffffu /* rounds to inf */,
                                      0x00000001u,
                                      0x80000000u,
                                      0x7fc00001u /* quiet NaN */,
                                      0x7f800001u /* signalling NaN */,
                                      0xffa00000u,
                                      0x7f800000u /* inf */,
                                      0xff800000u /* -inf */};
  std::vector<float> values;
  for (uint32_t b : bits) values.push_back(f32_from_bits(b));
  while (values.size() < 16) values.push_back(1.0f / 3.0f);
  check_rounding<4>(values);
  check_rounding<8>(values);
  check_rounding<16>(values);
}

// The bf16 paths' builds round whole vectors with vcvtneps2bf16, which takes denormals as zero,
// and keep the integer rounding for a vector with one: rows of ties, NaNs, infinities and
// denormals, mixed so that vectors with and without a denormal both occur, round as to_bf16 does,
// streamed or not.
TEST(EpilogueRows, ScaleRoundsSpecialsToBf16LikeToBf16) {
  const std::vector<uint32_t> specials = {0x3f808000u,
                                          0x3f818000u,
                                          0x7f7fffffu,
                                          0x7fc00001u,
                                          0x7f800001u,
                                          0xffa00000u,
                                          0x7f800000u,
                                          0xff800000u,
                                          0x80000000u,
                                          0x00000001u /* denormal */,
                                          0x807fffffu /* denormal */,
                                          0x00408000u /* denormal tie */,
                                          0x00418000u /* denormal tie */};
  constexpr int64_t kRows = 16;
  std::vector<float> acc(static_cast<size_t>(kRows * cpu::kPairWidth));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t col = 0; col < cpu::kPairWidth; ++col) {
      const size_t at = static_cast<size_t>(r * cpu::kPairWidth + col);
      // Rows 0-7: every special somewhere; rows 8-15: ordinary values but for one special that
      // is not a denormal.
      const size_t special = static_cast<size_t>(r * 7 + col * 3) % specials.size();
      acc[at] = r < 8 ? f32_from_bits(specials[special])
                      : (col == r ? f32_from_bits(specials[special % 9])
                                  : 1.0f / static_cast<float>(3 + r + col));
    }
  }
  std::vector<int32_t> ids(kRows);
  for (int64_t r = 0; r < kRows; ++r) ids[static_cast<size_t>(r)] = static_cast<int32_t>(r);
  for (const Epilogues& build : every_build()) {
    for (const bool stream : {false, true}) {
      SCOPED_TRACE(build.name + " stream=" + std::to_string(stream));
      alignas(64) uint16_t out[kRows * cpu::kPairWidth];
      std::fill(std::begin(out), std::end(out), kPoisonBits);
      cpu::EpilogueArgs e;
      e.acc = acc.data();
      e.rows = kRows;
      e.ids = ids.data();
      e.width = cpu::kPairWidth;
      e.out = out;
      e.out_stride = cpu::kPairWidth;
      e.out_dtype = DType::kBF16;
      e.stream = stream;
      build.scale_rows(e);
      for (size_t i = 0; i < acc.size(); ++i) {
        // scale_rows computes (acc + 0) * 1: -0 becomes +0, a signalling NaN quiet.
        const float expected = (acc[i] + 0.0f) * 1.0f;
        ASSERT_EQ(out[i], to_bf16(expected).bits)
            << "element " << i << ", value bits " << std::hex << f32_bits(acc[i]);
      }
    }
  }
}

TEST(EpilogueRows, SiluKeepsNan) {
  std::vector<float> acc(cpu::kPairWidth, 1.0f);
  acc[3] = std::numeric_limits<float>::quiet_NaN();
  const int32_t id = 0;
  for (const Epilogues& build : every_build()) {
    std::vector<uint16_t> out(cpu::kPanelWidth);
    cpu::EpilogueArgs e;
    e.acc = acc.data();
    e.rows = 1;
    e.ids = &id;
    e.width = cpu::kPanelWidth;
    e.out = out.data();
    e.out_stride = cpu::kPanelWidth;
    e.out_dtype = DType::kBF16;
    build.silu_rows(e);
    EXPECT_TRUE(std::isnan(to_f32(bf16{out[3]}))) << build.name;
    EXPECT_FALSE(std::isnan(to_f32(bf16{out[4]}))) << build.name;
  }
}

}  // namespace
}  // namespace moe::testing
