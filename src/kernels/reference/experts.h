// The reference experts: a plain per-expert loop in float64, the oracle every other backend is
// tested against. Never optimize this file; clarity is its only job.
#pragma once

#include "kernels/experts_problem.h"

namespace moe::reference {

// Computes problem.out exactly as include/moe/experts.h defines it, accumulating in double and
// rounding once to the output dtype.
void fused_experts(const ExpertsProblem& problem);

// act(gate, up) in double, as config.h defines each Activation.
double gated_activation(Activation activation, double gate, double up, double alpha, double limit);

}  // namespace moe::reference
