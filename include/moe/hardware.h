// What the deployment planner knows about a machine: one accelerator (or CPU socket) and the
// links between them, as built-in presets of spec-sheet figures that a user can override; and
// the storage formats the planner sizes weights, KV cache and dispatched activations in.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moe {

// How many bits one stored value takes. A superset of DType: the planner sizes formats (fp8,
// int8, int4) that today's kernels do not compute on. Scales of quantized formats are not
// counted (fp8 with 128x128 block scales adds 0.02%, int4 with a 16-bit scale per 128 values 3%).
enum class StorageFormat : uint8_t { kF32, kBF16, kF16, kFP8, kInt8, kInt4 };

int64_t storage_bits(StorageFormat format);
std::string_view storage_format_name(StorageFormat format);  // "f32", "bf16", ..., "int4"
// Parses those names and the usual aliases ("bfloat16", "fp8_e4m3", ...). Throws moe::Error
// naming `argument` (the option or field being parsed) and listing the accepted names.
StorageFormat parse_storage_format(std::string_view name, std::string_view argument);

// One device of a deployment and its links. Rates are per device, per direction.
struct Hardware {
  std::string name;
  std::string description;   // what the figures describe, for reports
  int64_t memory_bytes = 0;  // HBM (or host DRAM for a CPU)
  double memory_bytes_per_s = 0;
  double peak_flops_16bit = 0;     // dense bf16/f16 matrix throughput
  double peak_flops_fp8 = 0;       // dense fp8 matrix throughput; 0 = no fp8 units
  double link_bytes_per_s = 0;     // to a device of the same node (NVLink)
  double network_bytes_per_s = 0;  // to a device of another node (InfiniBand)
  int64_t devices_per_node = 1;
};

// "h100", "h200", "b200", "a100", "cpu". The GPU presets hold vendor peaks; "cpu" holds zeros
// for memory, bandwidth and flops, which the user must give.
std::vector<std::string> hardware_preset_names();
Hardware hardware_preset(std::string_view name);  // throws moe::Error listing the presets

// Throws moe::Error naming the field unless memory, bandwidth, flops and devices per node are
// positive. Link rates are checked by the planner only where the layout uses the link.
void validate(const Hardware& hardware);

}  // namespace moe
