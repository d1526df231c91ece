// Replica choice on the GPU: the expert slot that serves each (token, j) pair of this rank's
// tokens, by the rule of the CPU path (replica_candidates in parallel/dispatch_plan.h): among the
// `count` candidates of expert e, e's n-th pair of the batch (in pair order) takes candidate
// (n + rank) mod count. The table is built once on the host; the choice runs on the stream, with
// no host synchronization and no allocation, so a step stays capturable in a CUDA graph. The
// result is the same slot for the same routing as parallel::ReplicaChooser (tested against it).
// Tests: tests/parallel/cuda (mpirun -np 2, label gpu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe::cuda::ep {

struct ReplicaChoiceArgs {
  const int32_t* topk_ids = nullptr;           // [num_pairs] logical expert ids
  int64_t num_pairs = 0;                       // M * k
  int64_t num_experts = 0;                     // E, at most kMaxChoiceExperts
  const int32_t* candidate_offsets = nullptr;  // [E + 1] into candidates
  const int32_t* candidates = nullptr;         // the slots that may serve each expert's pairs
  int32_t max_candidates = 1;                  // the most of one expert (1: a plain lookup)
  int rank = 0;
  int32_t* slot_ids = nullptr;  // [num_pairs] out: the serving slot; -1 for ids outside [0, E)
};

inline constexpr int64_t kMaxChoiceExperts = 512;

void choose_replicas(const ReplicaChoiceArgs& args, cudaStream_t stream);

}  // namespace moe::cuda::ep
