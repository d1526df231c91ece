#include "core/safetensors_format.h"

#include <array>
#include <utility>

namespace moe {
namespace {

constexpr std::array<std::pair<DType, std::string_view>, 9> kNames = {{
    {DType::kF64, "F64"},
    {DType::kF32, "F32"},
    {DType::kF16, "F16"},
    {DType::kBF16, "BF16"},
    {DType::kF8E4M3, "F8_E4M3"},
    {DType::kI64, "I64"},
    {DType::kI32, "I32"},
    {DType::kI8, "I8"},
    {DType::kU8, "U8"},
}};

}  // namespace

std::string_view safetensors_dtype_name(DType dtype) {
  for (const auto& [value, name] : kNames) {
    if (value == dtype) return name;
  }
  return "unknown";
}

std::optional<DType> parse_safetensors_dtype(std::string_view name) {
  for (const auto& [value, known] : kNames) {
    if (known == name) return value;
  }
  return std::nullopt;
}

std::string_view safetensors_dtype_names() {
  return "F64, F32, F16, BF16, F8_E4M3, I64, I32, I8 or U8";
}

std::optional<uint64_t> checked_byte_size(const Shape& shape, DType dtype) {
  // Every partial product of the element count is at most the partial byte count, so keeping
  // the bytes within int64 keeps TensorView::numel() free of overflow too.
  int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t extent : shape) {
    if (extent < 0 || __builtin_mul_overflow(bytes, extent, &bytes)) return std::nullopt;
  }
  return static_cast<uint64_t>(bytes);
}

}  // namespace moe
