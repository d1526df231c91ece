// Hardware presets hold the spec-sheet figures they claim, and storage formats parse and size as
// documented; bad names fail with the argument named.
#include "moe/hardware.h"

#include <gtest/gtest.h>

#include "plan/plan_case.h"

namespace moe {
namespace {

TEST(Hardware, PresetsHoldVendorPeaks) {
  const Hardware h100 = hardware_preset("h100");
  EXPECT_EQ(h100.memory_bytes, 80'000'000'000);
  EXPECT_DOUBLE_EQ(h100.memory_bytes_per_s, 3.35e12);
  EXPECT_DOUBLE_EQ(h100.peak_flops_16bit, 989e12);
  EXPECT_DOUBLE_EQ(h100.link_bytes_per_s, 450e9);    // 900 GB/s bidirectional
  EXPECT_DOUBLE_EQ(h100.network_bytes_per_s, 50e9);  // 400 Gb/s
  EXPECT_EQ(h100.devices_per_node, 8);

  const Hardware h200 = hardware_preset("h200");
  EXPECT_EQ(h200.memory_bytes, 141'000'000'000);
  EXPECT_DOUBLE_EQ(h200.memory_bytes_per_s, 4.8e12);
  const Hardware b200 = hardware_preset("b200");
  EXPECT_DOUBLE_EQ(b200.memory_bytes_per_s, 8e12);
  EXPECT_DOUBLE_EQ(b200.link_bytes_per_s, 900e9);
  const Hardware a100 = hardware_preset("a100");
  EXPECT_DOUBLE_EQ(a100.peak_flops_16bit, 312e12);
  EXPECT_EQ(a100.peak_flops_fp8, 0);  // no fp8 units on Ampere
  EXPECT_DOUBLE_EQ(a100.link_bytes_per_s, 300e9);
}

TEST(Hardware, Fp8PeakIsTwiceBf16WhereThereIsOne) {
  for (std::string_view name : {"h100", "h200", "b200"}) {
    const Hardware hw = hardware_preset(name);
    EXPECT_NEAR(hw.peak_flops_fp8, 2 * hw.peak_flops_16bit, 0.01 * hw.peak_flops_16bit) << name;
  }
}

TEST(Hardware, EveryGpuPresetValidates) {
  for (const std::string& name : hardware_preset_names()) {
    if (name == "cpu") continue;
    EXPECT_NO_THROW(validate(hardware_preset(name))) << name;
  }
}

TEST(Hardware, CpuPresetNeedsItsFigures) {
  Hardware cpu = hardware_preset("cpu");
  EXPECT_NE(error_of([&] { validate(cpu); }).find("memory_bytes"), std::string::npos);
  cpu.memory_bytes = 512'000'000'000;
  cpu.memory_bytes_per_s = 300e9;
  EXPECT_NE(error_of([&] { validate(cpu); }).find("peak_flops_16bit"), std::string::npos);
  cpu.peak_flops_16bit = 5e12;
  EXPECT_NO_THROW(validate(cpu));
}

TEST(Hardware, UnknownPresetListsThePresets) {
  const std::string message = error_of([] { hardware_preset("tpu"); });
  EXPECT_NE(message.find("\"tpu\""), std::string::npos) << message;
  EXPECT_NE(message.find("h100, h200, b200, a100, cpu"), std::string::npos) << message;
}

TEST(StorageFormat, BitsNamesAndAliases) {
  EXPECT_EQ(storage_bits(StorageFormat::kF32), 32);
  EXPECT_EQ(storage_bits(StorageFormat::kBF16), 16);
  EXPECT_EQ(storage_bits(StorageFormat::kFP8), 8);
  EXPECT_EQ(storage_bits(StorageFormat::kInt8), 8);
  EXPECT_EQ(storage_bits(StorageFormat::kInt4), 4);
  for (StorageFormat format : {StorageFormat::kF32, StorageFormat::kBF16, StorageFormat::kF16,
                               StorageFormat::kFP8, StorageFormat::kInt8, StorageFormat::kInt4}) {
    EXPECT_EQ(parse_storage_format(storage_format_name(format), "test"), format);
  }
  EXPECT_EQ(parse_storage_format("bfloat16", "test"), StorageFormat::kBF16);
  EXPECT_EQ(parse_storage_format("fp8_e4m3", "test"), StorageFormat::kFP8);
}

TEST(StorageFormat, BadNameNamesTheArgument) {
  const std::string message = error_of([] { parse_storage_format("fp6", "--dtype"); });
  EXPECT_NE(message.find("--dtype"), std::string::npos) << message;
  EXPECT_NE(message.find("\"fp6\""), std::string::npos) << message;
  EXPECT_NE(message.find("f32, bf16, f16, fp8, int8, int4"), std::string::npos) << message;
}

}  // namespace
}  // namespace moe
