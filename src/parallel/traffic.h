// The expert-parallel byte counters of one step, by peer and by where the peer is: pure functions
// of per-peer counts and the communicator's hosts, shared by the CPU layer and the GPU one.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/communicator.h"
#include "moe/ep_layer.h"

namespace moe::parallel {

// per_peer [size] summed by domain from comm.rank()'s point of view: its own index is `self`,
// ranks of its host `same_host`, the others `cross_host`.
TrafficSplit split_by_domain(const std::vector<int64_t>& per_peer, const Communicator& comm);

// Bytes per row each way: a token row out (with what travels with it), a result row back.
struct RowBytes {
  int64_t out = 0;
  int64_t back = 0;
};

// Bytes this rank sends each peer in a step that sent rows_out[p] token rows to p and received
// rows_in[p] from it: rows_out[p] rows out plus rows_in[p] results back. With the two counts
// swapped, the bytes it receives from each.
std::vector<int64_t> bytes_to_each(const std::vector<int64_t>& rows_out,
                                   const std::vector<int64_t>& rows_in, RowBytes row_bytes);

}  // namespace moe::parallel
