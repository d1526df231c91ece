#include "parallel/cuda/gpu_per_rank.h"

#include <cstdio>
#include <vector>

#include "moe/nccl_communicator.h"

namespace moe::testing {

std::optional<int> gpu_of_this_rank(Communicator& world) {
  const int me = world.rank();
  int local_index = 0, local_ranks = 0;
  for (int r = 0; r < world.size(); ++r) {
    if (!world.same_host(r, me)) continue;
    if (r < me) ++local_index;
    ++local_ranks;
  }
  const int devices = cuda_device_count();
  const int mine = world.size() >= 2 && devices >= local_ranks ? 1 : 0;
  std::vector<int> all(static_cast<size_t>(world.size()));
  world.all_gather(&mine, sizeof mine, all.data());
  for (int ok : all) {
    if (ok) continue;
    if (me == 0) {
      std::printf(
          "SKIP: needs >= 2 ranks, each with its own CUDA device; %d ranks, %d devices for %d "
          "ranks on rank 0's host\n",
          world.size(), devices, local_ranks);
      std::fflush(stdout);
    }
    return std::nullopt;
  }
  return local_index;
}

}  // namespace moe::testing
