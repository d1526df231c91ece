#include "ops/cuda_plan_choice.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <vector>

#include "core/text_file.h"
#include "kernels/cuda/check.h"
#include "moe/error.h"
#include "ops/embedded_cuda_plans.h"

namespace moe::cuda_plans {
namespace {

// A table holds a few dozen entries; anything far larger is not one.
constexpr std::uintmax_t kMaxTableBytes = 1 << 20;

// Reads the unsigned decimal number at the front of `text` and drops it; false without one.
bool take_number(std::string_view& text, int64_t& value) {
  if (text.empty() || text.front() < '0' || text.front() > '9') return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data()) return false;
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return true;
}

bool take_prefix(std::string_view& text, std::string_view prefix) {
  if (!text.starts_with(prefix)) return false;
  text.remove_prefix(prefix.size());
  return true;
}

// Throws unless `name` is one table_file_name gives, so that a table saved under a misspelt name
// fails loudly instead of never being looked up. Parsed by hand rather than with std::regex:
// libstdc++'s regex templates are instantiated in every library that uses them, and in a Python
// process that has loaded PyTorch first, ours resolved to PyTorch's copies and crashed.
void check_file_name(const std::string& name, std::string_view source) {
  std::string_view rest = name;
  int64_t experts = 0, hidden = 0, intermediate = 0, top_k = 0;
  bool canonical = take_prefix(rest, "E=") && take_number(rest, experts) &&
                   take_prefix(rest, ",H=") && take_number(rest, hidden) &&
                   take_prefix(rest, ",I=") && take_number(rest, intermediate) &&
                   take_prefix(rest, ",k=") && take_number(rest, top_k) &&
                   take_prefix(rest, ",device_name=") && rest.ends_with(".json");
  if (canonical) {
    const std::string_view device = rest.substr(0, rest.size() - 5);
    canonical = !device.empty() && device.find_first_of(" /") == std::string_view::npos &&
                name == table_file_name(device, experts, hidden, intermediate, top_k);
  }
  if (!canonical) {
    fail(
        "{}: expected a plan table named E=<experts>,H=<hidden>,I=<intermediate>,k=<top_k>,"
        "device_name=<GPU name, spaces as _>.json; got the name \"{}\"",
        source, name);
  }
}

// The *.json files of `folder`, sorted so that errors come in a stable order.
std::vector<std::filesystem::path> table_files(const std::string& folder) {
  std::error_code error;
  std::filesystem::directory_iterator it(folder, error);
  if (error) {
    fail("tuning folder \"{}\" ({}): expected a folder of plan tables; cannot list it: {}", folder,
         kTuningDirVariable, error.message());
  }
  std::vector<std::filesystem::path> files;
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (it->path().extension() == ".json" && !it->is_directory()) files.push_back(it->path());
  }
  if (error) {
    fail("tuning folder \"{}\" ({}): cannot list it: {}", folder, kTuningDirVariable,
         error.message());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

PlanTable read_table_file(const std::filesystem::path& path) {
  return parse_table(read_small_text_file(path, kMaxTableBytes, "a plan table"), path.string());
}

PlanTables load_tables(const std::string& tuning_dir) {
  PlanTables tables;
  for (const EmbeddedTable& embedded : embedded_tables()) {
    const std::string name(embedded.file_name);
    const std::string source = "configs/cuda/" + name + " (compiled in)";
    check_file_name(name, source);
    tables[name] = parse_table(embedded.json_text, source);
  }
  if (tuning_dir.empty()) return tables;
  for (const std::filesystem::path& path : table_files(tuning_dir)) {
    const std::string name = path.filename().string();
    check_file_name(name, path.string());
    tables[name] = read_table_file(path);
  }
  return tables;
}

std::shared_ptr<const PlanTables> current_tables() {
  static std::mutex mutex;
  static std::shared_ptr<const PlanTables> tables;
  static std::string loaded_from;
  const char* value = std::getenv(kTuningDirVariable);
  const std::string tuning_dir = value != nullptr ? value : "";
  const std::lock_guard lock(mutex);
  if (tables == nullptr || tuning_dir != loaded_from) {
    tables = std::make_shared<const PlanTables>(load_tables(tuning_dir));
    loaded_from = tuning_dir;
  }
  return tables;
}

cuda::ExpertsPlan choose_plan(const ExpertsProblem& problem, std::string_view device_name,
                              const PlanTables& tables) {
  const auto table =
      tables.find(table_file_name(device_name, problem.num_local_experts, problem.hidden_size,
                                  problem.intermediate_size, problem.top_k));
  if (table != tables.end()) {
    const cuda::ExpertsPlan plan = closest_plan(table->second, problem.num_tokens);
    if (cuda::why_plan_cannot_run(plan, problem).empty()) return plan;
  }
  return cuda::default_plan(problem);
}

cuda::ExpertsPlan choose_plan(const ExpertsProblem& problem, std::string_view device_name) {
  return choose_plan(problem, device_name, *current_tables());
}

const std::string& device_name(int device) {
  thread_local std::map<int, std::string> names;  // the query is slow: once per thread and device
  const auto known = names.find(device);
  if (known != names.end()) return known->second;
  cudaDeviceProp properties{};
  cuda::check(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return names.emplace(device, properties.name).first->second;
}

}  // namespace moe::cuda_plans
