// For measurements: marks between the stages of a call, so that a timeline shows where a
// captured graph's time goes outside the kernels' own thread blocks (ExpertsRunner::
// record_timeline).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda {

// Launches one thread that writes the global timer (ns) to `*slot`. Stream order starts it once
// every earlier kernel on `stream` has finished, so the mark is when those ended (plus a launch)
// and the next kernel starts after it.
void record_time_mark(uint64_t* slot, cudaStream_t stream);

}  // namespace moe::cuda
