// Thread counts for the OpenMP loops of the CPU kernels.
#pragma once

#include <omp.h>

namespace moe::cpu {

// A requested thread count <= 0 means every thread OpenMP would use.
inline int resolve_num_threads(int requested) {
  return requested > 0 ? requested : omp_get_max_threads();
}

}  // namespace moe::cpu
