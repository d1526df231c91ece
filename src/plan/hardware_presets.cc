// The hardware presets: one table of spec-sheet figures. Every figure is a vendor peak (dense,
// no sparsity), not a measurement: real kernels reach perhaps 70-90% of the bandwidth and
// 50-80% of the flops, so plans built on them are floors. Users override any figure.
#include <algorithm>
#include <array>

#include <fmt/ranges.h>

#include "moe/error.h"
#include "moe/hardware.h"

namespace moe {
namespace {

constexpr double kGB = 1e9;
constexpr double kTB = 1e12;
constexpr double kTflops = 1e12;
// 400 Gb/s InfiniBand NDR, one NIC per GPU: the usual HGX node.
constexpr double kInfiniBand400 = 50 * kGB;

struct HardwarePreset {
  std::string_view name;
  std::string_view description;
  double memory_gb;  // decimal GB, as the spec sheets print it
  double memory_bytes_per_s;
  double peak_flops_16bit;
  double peak_flops_fp8;
  double link_bytes_per_s;  // NVLink, per direction: half the bidirectional figure vendors quote
  double network_bytes_per_s;
  int64_t devices_per_node;
};

// Vendor peaks, from the NVIDIA data sheets of each part (SXM modules in 8-GPU HGX nodes).
constexpr std::array kPresets = {
    HardwarePreset{"h100", "NVIDIA H100 SXM, HBM3, NVLink 4", 80, 3.35 * kTB, 989 * kTflops,
                   1979 * kTflops, 450 * kGB, kInfiniBand400, 8},
    HardwarePreset{"h200", "NVIDIA H200 SXM, HBM3e, NVLink 4", 141, 4.8 * kTB, 989 * kTflops,
                   1979 * kTflops, 450 * kGB, kInfiniBand400, 8},
    HardwarePreset{"b200", "NVIDIA B200 (HGX), HBM3e, NVLink 5", 180, 8 * kTB, 2250 * kTflops,
                   4500 * kTflops, 900 * kGB, kInfiniBand400, 8},
    // Ampere has no fp8 units: fp8 weights run through bf16 matrix instructions.
    HardwarePreset{"a100", "NVIDIA A100 SXM 80GB, HBM2e, NVLink 3", 80, 2.039 * kTB, 312 * kTflops,
                   0, 300 * kGB, kInfiniBand400, 8},
    // A CPU socket: no figure is typical enough to preset, so all must be given.
    HardwarePreset{"cpu", "CPU socket (figures given by the user)", 0, 0, 0, 0, 0, 0, 1},
};

}  // namespace

std::vector<std::string> hardware_preset_names() {
  std::vector<std::string> names;
  for (const HardwarePreset& preset : kPresets) names.emplace_back(preset.name);
  return names;
}

Hardware hardware_preset(std::string_view name) {
  const auto* preset = std::find_if(kPresets.begin(), kPresets.end(),
                                    [&](const HardwarePreset& p) { return p.name == name; });
  if (preset == kPresets.end()) {
    fail("hardware \"{}\": expected one of {}", name, fmt::join(hardware_preset_names(), ", "));
  }
  Hardware hardware;
  hardware.name = std::string(preset->name);
  hardware.description = std::string(preset->description);
  hardware.memory_bytes = static_cast<int64_t>(preset->memory_gb * kGB);
  hardware.memory_bytes_per_s = preset->memory_bytes_per_s;
  hardware.peak_flops_16bit = preset->peak_flops_16bit;
  hardware.peak_flops_fp8 = preset->peak_flops_fp8;
  hardware.link_bytes_per_s = preset->link_bytes_per_s;
  hardware.network_bytes_per_s = preset->network_bytes_per_s;
  hardware.devices_per_node = preset->devices_per_node;
  return hardware;
}

void validate(const Hardware& hw) {
  const auto positive = [&](double value, std::string_view field) {
    // !(value > 0) also rejects NaN.
    if (!(value > 0)) fail("hardware \"{}\": {}: expected > 0; got {}", hw.name, field, value);
  };
  positive(static_cast<double>(hw.memory_bytes), "memory_bytes");
  positive(hw.memory_bytes_per_s, "memory_bytes_per_s");
  positive(hw.peak_flops_16bit, "peak_flops_16bit");
  positive(static_cast<double>(hw.devices_per_node), "devices_per_node");
  if (!(hw.peak_flops_fp8 >= 0)) {
    fail("hardware \"{}\": peak_flops_fp8: expected >= 0 (0 = no fp8 units); got {}", hw.name,
         hw.peak_flops_fp8);
  }
  if (!(hw.link_bytes_per_s >= 0) || !(hw.network_bytes_per_s >= 0)) {
    fail("hardware \"{}\": link and network rates: expected >= 0; got {} and {}", hw.name,
         hw.link_bytes_per_s, hw.network_bytes_per_s);
  }
}

}  // namespace moe
