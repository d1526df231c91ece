#include "ops/cuda_plan_table.h"

#include <charconv>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_fields.h"
#include "moe/error.h"

namespace moe::cuda_plans {
namespace {

constexpr std::string_view kTinyName = "tiny";

// A plan no problem could run, whatever the GPU: the reason, or empty. The checks that depend
// on the problem and the device are cuda::why_plan_cannot_run's, made when a call uses the plan.
std::string why_malformed(const cuda::ExpertsPlan& plan) {
  const bool tiny_kernel =
      plan.kernel == cuda::GemmKernel::kStream || plan.kernel == cuda::GemmKernel::kDecode;
  if (plan.tiny_batch && (!tiny_kernel || plan.block_m != 1)) {
    return fmt::format(
        "the tiny-batch path runs the stream or decode kernel with block_m 1; got kernel {}, "
        "block_m {}",
        kernel_name(plan.kernel), plan.block_m);
  }
  switch (plan.kernel) {
    case cuda::GemmKernel::kDecode:
      if (plan.tiny_batch) return {};
      return "the decode kernel runs only with the tiny batch (tiny_batch true, block_m 1)";
    case cuda::GemmKernel::kStream:
      if (plan.block_m >= 1 && plan.block_m <= cuda::kMaxStreamRows) return {};
      return fmt::format("the stream kernel takes block_m in [1, {}]; got {}", cuda::kMaxStreamRows,
                         plan.block_m);
    case cuda::GemmKernel::kMma:
      if (cuda::mma_supports_block_m(plan.block_m)) return {};
      return fmt::format("the mma kernel takes block_m 16, 32, 64 or 128; got {}", plan.block_m);
    case cuda::GemmKernel::kWgmma:
      if (cuda::wgmma_supports_block_m(plan.block_m)) return {};
      return fmt::format("the wgmma kernel takes block_m 64 or 128; got {}", plan.block_m);
    case cuda::GemmKernel::kTma:
    case cuda::GemmKernel::kTmaEager:
    case cuda::GemmKernel::kTmaPair:
    case cuda::GemmKernel::kTmaDynamic:
      if (cuda::tma_supports_block_m(plan.block_m)) return {};
      return fmt::format("the {} kernel takes block_m 16, 64 or 128; got {}",
                         kernel_name(plan.kernel), plan.block_m);
  }
  return fmt::format("unsupported kernel: {}", static_cast<int>(plan.kernel));
}

bool parse_kernel(std::string_view name, cuda::GemmKernel& kernel) {
  for (const cuda::GemmKernel candidate :
       {cuda::GemmKernel::kStream, cuda::GemmKernel::kMma, cuda::GemmKernel::kWgmma,
        cuda::GemmKernel::kTma, cuda::GemmKernel::kTmaEager, cuda::GemmKernel::kTmaPair,
        cuda::GemmKernel::kTmaDynamic, cuda::GemmKernel::kDecode}) {
    if (name == kernel_name(candidate)) {
      kernel = candidate;
      return true;
    }
  }
  return false;
}

// A positive decimal integer written the one way format_table writes it (no sign, no leading
// zeros), so that two spellings of one M cannot both appear in a file.
bool parse_count(std::string_view text, int64_t& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size() && value > 0 &&
         text == std::to_string(value);
}

cuda::ExpertsPlan parse_entry(const nlohmann::json& entry, const std::string& key,
                              std::string_view source) {
  if (!entry.is_object()) {
    fail("{}: entry \"{}\": expected an object with kernel, block_m and tiny_batch; got {}", source,
         key, describe_json(entry));
  }
  for (const auto& [field, value] : entry.items()) {
    if (field != "kernel" && field != "block_m" && field != "tiny_batch") {
      fail("{}: entry \"{}\": unknown field \"{}\"; expected kernel, block_m and tiny_batch",
           source, key, field);
    }
  }
  const JsonFields fields(entry, source, key + ".");
  cuda::ExpertsPlan plan;
  const std::string kernel = fields.string("kernel");
  if (!parse_kernel(kernel, plan.kernel)) {
    fields.fail_field("kernel",
                      "stream, mma, wgmma, tma, tma_eager, tma_pair, tma_dynamic or decode",
                      fmt::format("\"{}\"", kernel));
  }
  plan.block_m = fields.positive("block_m");
  plan.tiny_batch = fields.boolean_or("tiny_batch", false);
  const std::string reason = why_malformed(plan);
  if (!reason.empty()) fail("{}: entry \"{}\": {}", source, key, reason);
  return plan;
}

}  // namespace

std::string_view kernel_name(cuda::GemmKernel kernel) {
  switch (kernel) {
    case cuda::GemmKernel::kStream:
      return "stream";
    case cuda::GemmKernel::kMma:
      return "mma";
    case cuda::GemmKernel::kWgmma:
      return "wgmma";
    case cuda::GemmKernel::kTma:
      return "tma";
    case cuda::GemmKernel::kTmaEager:
      return "tma_eager";
    case cuda::GemmKernel::kTmaPair:
      return "tma_pair";
    case cuda::GemmKernel::kTmaDynamic:
      return "tma_dynamic";
    case cuda::GemmKernel::kDecode:
      return "decode";
  }
  return "unknown";
}

std::string plan_name(const cuda::ExpertsPlan& plan) {
  if (plan.tiny_batch && plan.kernel == cuda::GemmKernel::kStream) {
    return fmt::format("{}/{}", kTinyName, plan.block_m);
  }
  return fmt::format("{}/{}", kernel_name(plan.kernel), plan.block_m);
}

cuda::ExpertsPlan parse_plan_name(std::string_view name) {
  const size_t slash = name.find('/');
  cuda::ExpertsPlan plan;
  const std::string_view kernel = name.substr(0, slash);
  plan.tiny_batch = kernel == kTinyName;
  const bool known_kernel = plan.tiny_batch || parse_kernel(kernel, plan.kernel);
  if (slash == std::string_view::npos || !known_kernel ||
      !parse_count(name.substr(slash + 1), plan.block_m)) {
    fail(
        "plan \"{}\": expected <kernel>/<block_m> with kernel tiny, stream, mma, wgmma, tma, "
        "tma_eager, tma_pair, tma_dynamic or decode",
        name);
  }
  if (plan.tiny_batch) plan.kernel = cuda::GemmKernel::kStream;
  if (plan.kernel == cuda::GemmKernel::kDecode) plan.tiny_batch = true;  // it runs no other way
  const std::string reason = why_malformed(plan);
  if (!reason.empty()) fail("plan \"{}\": {}", name, reason);
  return plan;
}

std::string table_file_name(std::string_view device_name, int64_t num_experts, int64_t hidden_size,
                            int64_t intermediate_size, int64_t top_k) {
  std::string device(device_name);
  for (char& c : device) {
    if (c == ' ' || c == '/') c = '_';
  }
  return fmt::format("E={},H={},I={},k={},device_name={}.json", num_experts, hidden_size,
                     intermediate_size, top_k, device);
}

PlanTable parse_table(std::string_view json_text, std::string_view source) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& error) {
    fail("{}: not valid JSON: {}", source, error.what());
  }
  if (!root.is_object()) {
    fail("{}: expected a JSON object keyed by token count; got {}", source, describe_json(root));
  }
  PlanTable table;
  for (const auto& [key, entry] : root.items()) {
    int64_t num_tokens = 0;
    if (!parse_count(key, num_tokens)) {
      fail("{}: key \"{}\": expected a token count (a positive integer without leading zeros)",
           source, key);
    }
    table[num_tokens] = parse_entry(entry, key, source);
  }
  if (table.empty()) fail("{}: expected at least one token count; the table is empty", source);
  return table;
}

std::string format_table(const PlanTable& table) {
  std::string text = "{\n";
  for (auto it = table.begin(); it != table.end(); ++it) {
    const cuda::ExpertsPlan& plan = it->second;
    text += fmt::format("  \"{}\": {{\"kernel\": \"{}\", \"block_m\": {}, \"tiny_batch\": {}}}{}\n",
                        it->first, kernel_name(plan.kernel), plan.block_m, plan.tiny_batch,
                        std::next(it) == table.end() ? "" : ",");
  }
  return text + "}\n";
}

cuda::ExpertsPlan closest_plan(const PlanTable& table, int64_t num_tokens) {
  if (table.empty()) fail("closest_plan: expected a table with at least one entry; got none");
  const auto above = table.lower_bound(num_tokens);  // the first M >= num_tokens
  if (above == table.begin()) return above->second;
  const auto below = std::prev(above);
  if (above == table.end()) return below->second;
  return num_tokens - below->first < above->first - num_tokens ? below->second : above->second;
}

}  // namespace moe::cuda_plans
