#include <cuda_bf16.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/fill_random.h"

namespace moe::cuda {
namespace {

// splitmix64: a full-period mix, good enough for benchmark data.
__device__ uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_kernel(__nv_bfloat16* data, int64_t count, uint64_t seed, float stddev) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * 2;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 2; i < count;
       i += stride) {
    const uint64_t bits = mix(seed ^ mix(static_cast<uint64_t>(i)));
    // Box-Muller: two normals from two 32-bit uniforms in (0, 1].
    const float u1 = (static_cast<float>(bits >> 40) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>((bits >> 8) & 0xffffff) * (1.0f / 16777216.0f);
    const float radius = stddev * sqrtf(-2.0f * logf(u1));
    float s, c;
    sincospif(2.0f * u2, &s, &c);
    data[i] = __float2bfloat16(radius * c);
    if (i + 1 < count) data[i + 1] = __float2bfloat16(radius * s);
  }
}

}  // namespace

void fill_normal_bf16(void* data, int64_t count, uint64_t seed, float stddev, cudaStream_t stream) {
  if (count == 0) return;
  const int64_t blocks = std::min<int64_t>((count / 2 + 255) / 256 + 1, 65536);
  fill_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data),
                                                                 count, seed, stddev);
  check_launch("fill_normal_bf16");
}

}  // namespace moe::cuda
