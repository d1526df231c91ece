#include "core/text_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "moe/error.h"

namespace moe {

std::string read_small_text_file(const std::filesystem::path& path, std::uintmax_t max_bytes,
                                 std::string_view what) {
  std::error_code folder_error;
  if (std::filesystem::is_directory(path, folder_error)) {
    fail("{}: is a folder; expected {}", path.string(), what);
  }
  // A size that cannot be read (no such file) is left to the open below, whose errno says why.
  std::error_code size_error;
  const std::uintmax_t size = std::filesystem::file_size(path, size_error);
  if (!size_error && size > max_bytes) {
    fail("{}: file is {} bytes; expected {} of at most {} bytes", path.string(), size, what,
         max_bytes);
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("{}: cannot open {}: {}", path.string(), what, std::strerror(errno));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) fail("{}: cannot read {}: {}", path.string(), what, std::strerror(errno));
  return text.str();
}

}  // namespace moe
