#include "parallel/cuda/ep_status.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace moe::cuda::ep {

std::string format_status(const Status& status, int rank, int num_ranks, int64_t capacity) {
  if (status.bits == 0) return {};
  std::string message =
      fmt::format("expert-parallel step {} on rank {} failed:", status.step, rank);
  if ((status.bits & (kStatusOverflow | kStatusPeerOverflow)) != 0) {
    message += fmt::format(" low-latency capacity of {} rows per (source, destination) exceeded",
                           capacity);
    for (int p = 0; p < num_ranks && p < kMaxRanks; ++p) {
      if (status.needed_to[p] > capacity) {
        message +=
            fmt::format("; rank {} needed {} rows for rank {}", rank, status.needed_to[p], p);
      }
      if (status.needed_from[p] > capacity && p != rank) {
        message +=
            fmt::format("; rank {} needed {} rows for rank {}", p, status.needed_from[p], rank);
      }
    }
    if ((status.bits & kStatusPeerOverflow) != 0) {
      message += fmt::format("; reported by rank {}", status.overflow_reported_by);
    }
    message += " (raise the capacity to the most tokens a rank sends in one step)";
  }
  if ((status.bits & (kStatusDispatchTimeout | kStatusCombineTimeout)) != 0) {
    const char* stage = (status.bits & kStatusDispatchTimeout) != 0 ? "dispatch" : "combine";
    message += fmt::format(
        " timed out waiting for rank {} in {} (expected step {}, its flag held step {} count {}); "
        "the peer died, stalled or runs another step",
        status.timeout_peer, stage, status.timeout_expected_step,
        static_cast<uint32_t>(status.timeout_last_flag >> 32),
        static_cast<uint32_t>(status.timeout_last_flag) & ~kOverflowSeenBit);
  }
  return message;
}

std::string format_exchange_failure(uint32_t step, int rank, const char* stage,
                                    const char* exchange, const std::vector<int>& peers,
                                    const std::string& cause) {
  return fmt::format(
      "expert-parallel step {} on rank {} failed in {}: {} with ranks [{}] did not complete: {}",
      step, rank, stage, exchange, fmt::join(peers, ", "), cause);
}

}  // namespace moe::cuda::ep
