// Storage formats the planner sizes: bits per value and their names.
#include <array>

#include <fmt/ranges.h>

#include "moe/error.h"
#include "moe/hardware.h"

namespace moe {
namespace {

struct FormatName {
  std::string_view name;
  StorageFormat format;
};

// The first name of each format is the one reports print.
constexpr std::array kFormatNames = {
    FormatName{"f32", StorageFormat::kF32},       FormatName{"fp32", StorageFormat::kF32},
    FormatName{"float32", StorageFormat::kF32},   FormatName{"bf16", StorageFormat::kBF16},
    FormatName{"bfloat16", StorageFormat::kBF16}, FormatName{"f16", StorageFormat::kF16},
    FormatName{"fp16", StorageFormat::kF16},      FormatName{"float16", StorageFormat::kF16},
    FormatName{"fp8", StorageFormat::kFP8},       FormatName{"fp8_e4m3", StorageFormat::kFP8},
    FormatName{"e4m3", StorageFormat::kFP8},      FormatName{"int8", StorageFormat::kInt8},
    FormatName{"int4", StorageFormat::kInt4},
};

}  // namespace

int64_t storage_bits(StorageFormat format) {
  switch (format) {
    case StorageFormat::kF32:
      return 32;
    case StorageFormat::kBF16:
    case StorageFormat::kF16:
      return 16;
    case StorageFormat::kFP8:
    case StorageFormat::kInt8:
      return 8;
    case StorageFormat::kInt4:
      return 4;
  }
  fail("storage format: unsupported value {}", static_cast<int>(format));
}

std::string_view storage_format_name(StorageFormat format) {
  for (const FormatName& entry : kFormatNames) {
    if (entry.format == format) return entry.name;
  }
  fail("storage format: unsupported value {}", static_cast<int>(format));
}

StorageFormat parse_storage_format(std::string_view name, std::string_view argument) {
  for (const FormatName& entry : kFormatNames) {
    if (entry.name == name) return entry.format;
  }
  std::vector<std::string_view> names;  // one per format, without the aliases
  for (const FormatName& entry : kFormatNames) {
    if (storage_format_name(entry.format) == entry.name) names.push_back(entry.name);
  }
  fail("{}: expected one of {}; got \"{}\"", argument, fmt::join(names, ", "), name);
}

}  // namespace moe
