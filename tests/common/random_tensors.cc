#include "common/random_tensors.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "moe/error.h"

namespace moe::testing {

void fill_normal(const TensorView& t, uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (float& v : values) v = normal(rng);
  convert_from_f32(values.data(), t.dtype, t.data, values.size());
}

Tensor random_normal(DType dtype, Shape shape, uint64_t seed, float stddev) {
  Tensor t(dtype, std::move(shape));
  fill_normal(t, seed, stddev);
  return t;
}

void fill_uniform_int(const TensorView& t, uint64_t seed, int32_t lo, int32_t hi) {
  if (t.dtype != DType::kI32) fail("fill_uniform_int: expected an int32 tensor");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> uniform(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.as<int32_t>()[i] = uniform(rng);
}

void fill_small_ints(const TensorView& t, uint64_t seed, int lo, int hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> uniform(lo, hi);
  std::vector<float> values(static_cast<size_t>(t.numel()));
  for (float& v : values) v = static_cast<float>(uniform(rng));
  convert_from_f32(values.data(), t.dtype, t.data, values.size());
}

void poison(const TensorView& t) {
  if (t.numel() > 0) std::memset(t.data, 0xff, t.nbytes());
}

double element(const TensorView& t, int64_t index) {
  switch (t.dtype) {
    case DType::kF32:
      return t.as<float>()[index];
    case DType::kBF16:
      return to_f32(t.as<bf16>()[index]);
    case DType::kF16:
      return to_f32(t.as<f16>()[index]);
    case DType::kF8E4M3:
      return to_f32(t.as<f8e4m3>()[index]);
    case DType::kF64:
      return t.as<double>()[index];
    case DType::kI32:
      return t.as<int32_t>()[index];
    case DType::kI8:
      return t.as<int8_t>()[index];
    case DType::kU8:
      return t.as<uint8_t>()[index];
    case DType::kI64:
      return static_cast<double>(t.as<int64_t>()[index]);
  }
  return std::numeric_limits<double>::quiet_NaN();
}

Comparison compare(const TensorView& got, const TensorView& expected) {
  if (got.shape != expected.shape) {
    fail("compare: shapes differ: got {} vs expected {}", shape_string(got.shape),
         shape_string(expected.shape));
  }
  Comparison c;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = element(got, i);
    const double e = element(expected, i);
    if (std::isnan(g) != std::isnan(e)) {
      if (!c.nan_mismatch) {
        c.nan_mismatch = true;
        c.worst_index = i;
        c.worst_expected = e;
        c.worst_got = g;
      }
      continue;
    }
    if (std::isnan(e)) continue;
    c.max_abs_expected = std::max(c.max_abs_expected, std::abs(e));
    const double error =
        std::isinf(e) || std::isinf(g) ? (g == e ? 0.0 : INFINITY) : std::abs(g - e);
    if (error > c.max_abs_error && !c.nan_mismatch) {
      c.max_abs_error = error;
      c.worst_index = i;
      c.worst_expected = e;
      c.worst_got = g;
    }
  }
  c.max_rel_error = c.max_abs_error / std::max(c.max_abs_expected, 1e-30);
  if (c.nan_mismatch) c.max_rel_error = INFINITY;
  return c;
}

std::string Comparison::describe() const {
  return fmt::format(
      "max_rel_error {:.3g} (max |error| {:.3g}, max |expected| {:.3g}); worst at "
      "flat index {}: expected {:.9g}, got {:.9g}{}",
      max_rel_error, max_abs_error, max_abs_expected, worst_index, worst_expected, worst_got,
      nan_mismatch ? " (NaN where the other has a number)" : "");
}

}  // namespace moe::testing
