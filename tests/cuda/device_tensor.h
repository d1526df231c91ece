// GPU copies of host tensors for the CUDA tests, and the skip rule for machines without a GPU.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "moe/tensor.h"

namespace moe::testing {

bool gpu_present();

// Tests that need a GPU derive from this: without one they are skipped, not failed.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

// A device copy of a host tensor (same dtype and shape), freed with the object.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(const TensorView& host);
  static DeviceTensor empty_like(DType dtype, Shape shape);

  TensorView view() const;
  operator TensorView() const { return view(); }
  Tensor to_host() const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::shared_ptr<void> data_;
};

}  // namespace moe::testing
