// The vocabulary of the safetensors format shared by its reader and writer: the layout
// constants, the dtype names the files use, and the overflow-checked byte size of a shape.
//
// Layout: an 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data buffer.
// The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// into the data buffer) and may hold a "__metadata__" object of string values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "moe/tensor.h"

namespace moe {

inline constexpr size_t kSafetensorsLengthBytes = 8;
// Writers pad the header with spaces so the data buffer starts at a multiple of this.
inline constexpr size_t kSafetensorsDataAlignment = 8;
// Real headers are kilobytes to a few megabytes; a larger length means a file that is not
// safetensors (or a corrupt one), and refusing it keeps us from parsing gigabytes as JSON.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;

// The reserved key of the header that holds string metadata instead of a tensor.
inline constexpr std::string_view kSafetensorsMetadataKey = "__metadata__";

// "F32", "BF16", "F8_E4M3", ... as the files spell them.
std::string_view safetensors_dtype_name(DType dtype);
// The inverse; nullopt for names we do not support (BOOL, F8_E5M2, U16, ...).
std::optional<DType> parse_safetensors_dtype(std::string_view name);
// The list of supported names, for error messages.
std::string_view safetensors_dtype_names();

// numel(shape) * dtype_size(dtype), or nullopt when a dimension is negative or a partial
// product overflows int64.
std::optional<uint64_t> checked_byte_size(const Shape& shape, DType dtype);

}  // namespace moe
