// The whole of a small text file (config.json, an index, a plan table), read at once with a bound
// on its size, so a mistaken path to a large file fails instead of being read into memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace moe {

// Fails with a moe::Error naming the file when it is a folder, is larger than max_bytes, or
// cannot be opened or read. `what` names the file expected, for messages ("a plan table").
std::string read_small_text_file(const std::filesystem::path& path, std::uintmax_t max_bytes,
                                 std::string_view what);

}  // namespace moe
