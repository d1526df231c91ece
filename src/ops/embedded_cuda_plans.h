// The repo's plan tables (configs/cuda/*.json) compiled into the library, so that an installed
// build needs no data files. src/ops/CMakeLists.txt generates the definition from the files when
// CMake configures, and configures again when one is added, removed or edited.
#pragma once

#include <span>
#include <string_view>

namespace moe::cuda_plans {

struct EmbeddedTable {
  std::string_view file_name;  // as table_file_name spells it
  std::string_view json_text;  // the file's text, parsed on first use
};

std::span<const EmbeddedTable> embedded_tables();

}  // namespace moe::cuda_plans
