// Exits 0 when this machine has a CUDA device, 77 (ctest's skip) otherwise: the skip rule of the
// GPU tests, for the scripts that run the moe command line on a GPU.
#include <cstdio>

#include "cuda/device_tensor.h"

int main() {
  if (moe::testing::gpu_present()) return 0;
  std::puts("no CUDA device on this machine: skipped");
  return 77;
}
