// Seeded random bf16 on the GPU (synthetic weights and inputs for benchmarks), without a trip
// through host memory: tens of GB of DeepSeek-V3 expert weights fill in milliseconds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda {

// data[i] = bf16(N(0, stddev^2)) from a counter-based hash of (seed, i): the same on any grid.
void fill_normal_bf16(void* data, int64_t count, uint64_t seed, float stddev, cudaStream_t stream);

}  // namespace moe::cuda
