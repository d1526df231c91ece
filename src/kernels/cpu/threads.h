// Thread counts for the OpenMP loops of the CPU kernels.
#pragma once

#include <omp.h>

namespace moe::cpu {

// Every parallel region of one call uses the same team size, even when it has less work than
// threads: libgomp keeps the last team for reuse only when the next region asks for the same
// size (and allocates a one-thread team on every region), so changing sizes would allocate on
// every call. An idle thread costs only its wake-up.
//
// A requested thread count <= 0 means every thread OpenMP would use.
inline int resolve_num_threads(int requested) {
  return requested > 0 ? requested : omp_get_max_threads();
}

}  // namespace moe::cpu
