// What the expert-parallel kernels report back to the host: overflow of the low-latency capacity
// and waits on peers that ran out of time. The kernels never stop on an error (a rank that stopped
// early would leave its peers waiting); they record it here, finish the step with what they have,
// and the host turns the record into a moe::Error after the step (format_status). Waits in a
// communicator inside a step are reported alike, with the step and stage (format_exchange_failure).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe::cuda::ep {

// Ranks of one host that the IPC path connects (a flag word and a buffer region per rank).
inline constexpr int kMaxRanks = 8;

// Bit 31 of a published row count: the publisher saw an overflow in this step (its own or a
// peer's), so every rank learns of it in the same step and fails it.
inline constexpr uint32_t kOverflowSeenBit = 1u << 31;

enum StatusBits : uint32_t {
  kStatusOverflow = 1u,         // a source needed more rows for a destination than the capacity
  kStatusPeerOverflow = 2u,     // a peer reported an overflow this rank did not see itself
  kStatusDispatchTimeout = 4u,  // a dispatch flag never came
  kStatusCombineTimeout = 8u,   // a combine flag never came
};

// Device memory, zeroed by the host after it reads an error it can recover from (overflow).
struct Status {
  uint32_t bits = 0;
  uint32_t step = 0;  // the step that set the first bit
  // Rows this rank needed for each destination, and rows each source needed for this rank, as
  // published (only entries over the capacity matter for the report).
  int32_t needed_to[kMaxRanks] = {};
  int32_t needed_from[kMaxRanks] = {};
  int32_t overflow_reported_by = -1;  // a peer whose combine flag carried kOverflowSeenBit
  // The first wait that timed out: which peer, in which stage, what it was waiting for and what
  // the flag held.
  int32_t timeout_peer = -1;
  uint32_t timeout_expected_step = 0;
  uint64_t timeout_last_flag = 0;
};

// The error message for a status with bits set: rank, step, counts, peers. Empty when clear.
std::string format_status(const Status& status, int rank, int num_ranks, int64_t capacity);

// The error message for an exchange through a communicator that failed inside a step (the token
// or row counts through the host communicator, the rows over NCCL): the step, this rank, the
// stage ("dispatch" or "combine"), what was exchanged with which peers, and the communicator's
// own error (which says whether it timed out and, with MPI, which peers never answered).
std::string format_exchange_failure(uint32_t step, int rank, const char* stage,
                                    const char* exchange, const std::vector<int>& peers,
                                    const std::string& cause);

}  // namespace moe::cuda::ep
