// The checks of a safetensors header, over the file's bytes in memory. SafetensorsFile::open()
// maps the file and calls parse_safetensors(); the fuzz target (fuzz/safetensors_fuzz.cc) calls
// it on a heap buffer of exactly the input's size, so ASan sees any read past the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "moe/tensor.h"

namespace moe {

// A tensor's entry as the header states it, checked against the data buffer's size.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // byte range [begin, end) in the data buffer
  uint64_t end = 0;
};

struct SafetensorsLayout {
  std::vector<SafetensorsEntry> entries;  // in header order
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // where the data buffer starts in the file: 8 + header length
};

// Checks everything SafetensorsFile::open() documents; throws moe::Error naming `path` (used
// only in messages). On return every entry's range lies within `file`, past data_offset.
SafetensorsLayout parse_safetensors(const std::string& path, std::span<const std::byte> file);

}  // namespace moe
