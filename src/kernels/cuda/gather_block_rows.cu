// One warp per row of the padded layout, 16-byte copies. A lane's loads of a row are issued
// before its stores so that each warp keeps several round trips to memory in flight.
#include "kernels/cuda/alignment.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/gather_block_rows.h"
#include "moe/error.h"

namespace moe::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 4;  // 16-byte chunks a lane loads before it stores them

__global__ void __launch_bounds__(kWarps * 32) gather_block_rows_kernel(GatherBlockRowsArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= *a.num_pairs_post_padded) return;
  const int32_t expert = a.expert_ids[row / a.block_m];
  if (expert < 0 || expert >= a.num_local_experts) return;
  const int32_t pair = a.sorted_pair_ids[row];
  if (pair < 0 || pair >= a.num_pairs) return;  // padding
  const int64_t chunks = a.hidden_size / 8;
  const auto* source = static_cast<const uint4*>(a.hidden) + pair / a.top_k * chunks;
  auto* target = static_cast<uint4*>(a.out) + row * chunks;
  const int lane = threadIdx.x % 32;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kUnroll) {
    uint4 values[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c < chunks) values[u] = __ldg(source + c);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c < chunks) target[c] = values[u];
    }
  }
}

}  // namespace

void gather_block_rows(const GatherBlockRowsArgs& args, cudaStream_t stream) {
  if (args.max_rows == 0) return;
  if (args.hidden_size % 8 != 0 || !aligned16(args.hidden) || !aligned16(args.out)) {
    fail("gather_block_rows: expected H % 8 == 0 and 16-byte aligned rows; got H {}",
         args.hidden_size);
  }
  const auto blocks = static_cast<unsigned>((args.max_rows + kWarps - 1) / kWarps);
  gather_block_rows_kernel<<<blocks, kWarps * 32, 0, stream>>>(args);
  check_launch("gather_block_rows");
}

}  // namespace moe::cuda
