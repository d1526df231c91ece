#include "parallel/traffic.h"

#include "moe/error.h"

namespace moe::parallel {

TrafficSplit split_by_domain(const std::vector<int64_t>& per_peer, const Communicator& comm) {
  if (per_peer.size() != static_cast<size_t>(comm.size())) {
    fail("split_by_domain: expected one count per rank ({}); got {}", comm.size(), per_peer.size());
  }
  TrafficSplit split;
  for (int p = 0; p < comm.size(); ++p) {
    const int64_t bytes = per_peer[static_cast<size_t>(p)];
    if (p == comm.rank()) {
      split.self += bytes;
    } else if (comm.same_host(p, comm.rank())) {
      split.same_host += bytes;
    } else {
      split.cross_host += bytes;
    }
  }
  return split;
}

std::vector<int64_t> bytes_to_each(const std::vector<int64_t>& rows_out,
                                   const std::vector<int64_t>& rows_in, RowBytes row_bytes) {
  if (rows_out.size() != rows_in.size()) {
    fail("bytes_to_each: rows_out and rows_in must have one count per rank; got {} and {}",
         rows_out.size(), rows_in.size());
  }
  std::vector<int64_t> bytes(rows_out.size());
  for (size_t p = 0; p < bytes.size(); ++p) {
    bytes[p] = rows_out[p] * row_bytes.out + rows_in[p] * row_bytes.back;
  }
  return bytes;
}

}  // namespace moe::parallel
