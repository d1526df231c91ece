// libFuzzer target for the safetensors header checks (parse_safetensors, which
// SafetensorsFile::open() calls on the mapped file). The input is copied into a heap buffer of
// exactly its size, so ASan reports any read past the end; on success every tensor's byte range
// is read, so a range the checks let through past the buffer shows up as well. Every moe::Error
// is an expected outcome. Run it with scripts/fuzz-safetensors; results are in docs/fuzzing.md.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

#include "core/safetensors_parse.h"
#include "moe/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // libFuzzer's own buffer may sit inside a larger allocation; a copy of exactly `size` bytes
  // puts a redzone right after the last byte.
  const auto file = std::make_unique<std::byte[]>(size);
  if (size != 0) std::memcpy(file.get(), data, size);
  try {
    const moe::SafetensorsLayout layout =
        moe::parse_safetensors("fuzz-input", std::span<const std::byte>(file.get(), size));
    unsigned sum = 0;
    for (const moe::SafetensorsEntry& entry : layout.entries) {
      const std::byte* bytes = file.get() + layout.data_offset;
      for (uint64_t i = entry.begin; i < entry.end; ++i) sum += std::to_integer<unsigned>(bytes[i]);
    }
    // Keeps the reads from being optimized away.
    volatile unsigned sink = sum;
    (void)sink;
  } catch (const moe::Error&) {
  }
  return 0;
}
