// What the ranks of `moe bench --ep` measured over the passes of one workload, reduced to the
// figures of its report (ep_bench_report.h): the same reduction for the CPU ranks' EpMoeLayer and
// the GPUs' CudaEpLayer, whose stats the GPU bench gives in the CPU layer's form.
#pragma once

#include <vector>

#include "moe/communicator.h"
#include "moe/ep_layer.h"
#include "tools/moe/ep_bench_report.h"
#include "tools/moe/ep_workload.h"

namespace moe::cli {

// A collective: every rank passes its own stats. `counted` is one pass over the workload's steps,
// whose counters are summed step by step (every pass routes alike); `timed` is whole passes over
// them, whose stage times give each stage's time per pass (the median over the passes of its sum
// over the pass's steps) and each step's time (the slowest rank's total).
EpBenchGroup reduce_ep_bench(Communicator& comm, const Workload& workload,
                             const std::vector<EpStepStats>& counted,
                             const std::vector<EpStepStats>& timed);

}  // namespace moe::cli
