// The CPU experts pipeline. Stage by stage, as include/moe/experts.h defines it:
//   align   pairs grouped by expert into blocks (or one pair per block for tiny batches)
//   gemm1   cache1[p] = hidden[p / k] · w13[e]^T        (rows read in place, written in pair order)
//   act     cache2[p] = act(cache1[p])
//   gemm2   cache3[p] = topk_weights[p] * cache2[p] · w2[e]^T   (cache3 reuses cache1's memory)
//   shared  the always-on MLP over all tokens, as a one-expert grouped GEMM
//   sum     out[t] = sum_j cache3[t*k + j] + shared[t]
// Tested by tests/experts against the reference backend.
#include "kernels/cpu/fused_experts.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/cpu/align_block_size.h"
#include "kernels/cpu/gated_activation.h"
#include "kernels/cpu/grouped_gemm.h"
#include "kernels/cpu/moe_sum.h"
#include "kernels/cpu/threads.h"
#include "moe/align.h"

namespace moe::cpu {

namespace {

template <typename T>
T* grown(std::vector<T>& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(static_cast<size_t>(size));
  return buffer.data();
}

class StageClock {
 public:
  explicit StageClock(StageTimes* times) : times_(times), last_(now()) {}
  // Adds the time since the previous lap to `field` of the stage times.
  void lap(double StageTimes::*field) {
    const auto t = now();
    if (times_) times_->*field += std::chrono::duration<double, std::micro>(t - last_).count();
    last_ = t;
  }

 private:
  static std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }
  StageTimes* times_;
  std::chrono::steady_clock::time_point last_;
};

struct Alignment {
  const int32_t* sorted_pair_ids;
  const int32_t* expert_ids;
  int64_t num_blocks;
  int64_t block_m;
};

Alignment align_pairs(const ExpertsProblem& pb, int64_t block_m, ExpertsWorkspace& ws) {
  const int64_t num_pairs = pb.num_pairs();
  if (use_tiny_batch_path(pb.num_tokens, pb.top_k, pb.num_experts, pb.expert_map != nullptr)) {
    int32_t* sorted = grown(ws.sorted_pair_ids, num_pairs);
    int32_t* experts = grown(ws.expert_ids, num_pairs);
    align_tiny_batch(pb.topk_ids, num_pairs, sorted, experts);
    return {sorted, experts, num_pairs, 1};
  }
  const int64_t capacity = max_num_pairs_post_padded(num_pairs, pb.num_experts, block_m);
  int32_t* sorted = grown(ws.sorted_pair_ids, capacity);
  int32_t* experts = grown(ws.expert_ids, capacity / block_m + 1);
  int32_t* offsets = grown(ws.expert_offsets, pb.num_experts + 1);
  const int64_t padded = align_block_size(pb.topk_ids, num_pairs, pb.num_experts, block_m,
                                          pb.expert_map, sorted, experts, offsets);
  return {sorted, experts, padded / block_m, block_m};
}

GroupedGemmArgs gemm_args(const Alignment& alignment, int64_t num_pairs) {
  GroupedGemmArgs args;
  args.sorted_pair_ids = alignment.sorted_pair_ids;
  args.expert_ids = alignment.expert_ids;
  args.num_blocks = alignment.num_blocks;
  args.block_m = alignment.block_m;
  args.num_pairs = num_pairs;
  return args;
}

// Per-thread panels of the grouped GEMM, wide enough for every GEMM of the problem.
float* grown_gemm_scratch(const ExpertsProblem& pb, int64_t block_m, ExpertsWorkspace& ws,
                          int num_threads) {
  const int64_t widest_k =
      std::max(pb.hidden_size, std::max(pb.intermediate_size, pb.shared_intermediate_size));
  return grown(ws.gemm_scratch,
               num_threads * grouped_gemm_scratch_floats(std::max(block_m, int64_t{1}), widest_k));
}

// The shared MLP as a grouped GEMM with one expert whose "pairs" are the tokens themselves.
void run_shared_experts(const ExpertsProblem& pb, int64_t block_m, ExpertsWorkspace& ws,
                        const ActivationParams& act, float* scratch, int num_threads) {
  const int64_t M = pb.num_tokens, H = pb.hidden_size, Is = pb.shared_intermediate_size;
  const int64_t num_blocks = (M + block_m - 1) / block_m;
  int32_t* ids = grown(ws.shared_pair_ids, num_blocks * block_m);
  for (int64_t i = 0; i < num_blocks * block_m; ++i) ids[i] = static_cast<int32_t>(std::min(i, M));
  int32_t* experts = grown(ws.shared_expert_ids, num_blocks);
  std::fill(experts, experts + num_blocks, 0);
  const Alignment alignment{ids, experts, num_blocks, block_m};

  float* gate = nullptr;
  if (pb.shared_gate) {
    gate = grown(ws.shared_gate, M);
    GroupedGemmArgs args = gemm_args(alignment, M);
    args.a = pb.hidden;
    args.a_dtype = pb.hidden_dtype;
    args.w = pb.shared_gate;
    args.w_dtype = pb.weight_dtype;
    args.n = 1;
    args.k_dim = H;
    args.c = gate;
    grouped_gemm(args, scratch, num_threads);
    for (int64_t t = 0; t < M; ++t) gate[t] = 1.0f / (1.0f + std::exp(-gate[t]));
  }

  float* cache1 = grown(ws.shared_cache1, M * 2 * Is);
  GroupedGemmArgs up = gemm_args(alignment, M);
  up.a = pb.hidden;
  up.a_dtype = pb.hidden_dtype;
  up.w = pb.shared_w13;
  up.w_dtype = pb.weight_dtype;
  up.n = 2 * Is;
  up.k_dim = H;
  up.c = cache1;
  grouped_gemm(up, scratch, num_threads);

  float* cache2 = grown(ws.shared_cache2, M * Is);
  gated_activation(act, cache1, M, Is, cache2, num_threads);

  GroupedGemmArgs down = gemm_args(alignment, M);
  down.a = cache2;
  down.a_dtype = DType::kF32;
  down.w = pb.shared_w2;
  down.w_dtype = pb.weight_dtype;
  down.out_scale = gate;
  down.n = H;
  down.k_dim = Is;
  down.c = grown(ws.shared_out, M * H);
  grouped_gemm(down, scratch, num_threads);
}

}  // namespace

const float* routed_pair_outputs(const ExpertsProblem& pb, int64_t block_m, ExpertsWorkspace& ws,
                                 int num_threads, StageTimes* times) {
  num_threads = resolve_num_threads(num_threads);
  const int64_t H = pb.hidden_size, I = pb.intermediate_size;
  const int64_t num_pairs = pb.num_pairs();
  const ActivationParams act{pb.activation, pb.swiglu_alpha, pb.swiglu_limit};
  StageClock clock(times);

  const Alignment alignment = align_pairs(pb, block_m, ws);
  clock.lap(&StageTimes::align_us);

  float* scratch = grown_gemm_scratch(pb, block_m, ws, num_threads);
  float* cache13 = grown(ws.cache13, num_pairs * std::max(2 * I, H));

  GroupedGemmArgs gemm1 = gemm_args(alignment, num_pairs);
  gemm1.a = pb.hidden;
  gemm1.a_dtype = pb.hidden_dtype;
  gemm1.a_row_divisor = pb.top_k;
  gemm1.a_row_ptrs = pb.hidden_row_ptrs;
  gemm1.a_scale = pb.weight_on_input ? pb.topk_weights : nullptr;
  gemm1.w = pb.w13;
  gemm1.w_dtype = pb.weight_dtype;
  gemm1.bias = pb.w13_bias;
  gemm1.n = 2 * I;
  gemm1.k_dim = H;
  gemm1.c = cache13;
  grouped_gemm(gemm1, scratch, num_threads);
  clock.lap(&StageTimes::gemm1_us);

  float* cache2 = grown(ws.cache2, num_pairs * I);
  gated_activation(act, cache13, num_pairs, I, cache2, num_threads);
  clock.lap(&StageTimes::act_us);

  GroupedGemmArgs gemm2 = gemm_args(alignment, num_pairs);
  gemm2.a = cache2;
  gemm2.a_dtype = DType::kF32;
  gemm2.w = pb.w2;
  gemm2.w_dtype = pb.weight_dtype;
  gemm2.bias = pb.w2_bias;
  gemm2.out_scale = pb.weight_on_input ? nullptr : pb.topk_weights;
  gemm2.n = H;
  gemm2.k_dim = I;
  gemm2.c = cache13;  // cache3: cache1 was fully consumed by act
  grouped_gemm(gemm2, scratch, num_threads);
  clock.lap(&StageTimes::gemm2_us);
  return cache13;
}

const float* shared_expert_outputs(const ExpertsProblem& pb, int64_t block_m, ExpertsWorkspace& ws,
                                   int num_threads, StageTimes* times) {
  if (pb.shared_intermediate_size == 0) return nullptr;
  num_threads = resolve_num_threads(num_threads);
  StageClock clock(times);
  const ActivationParams act{pb.activation, pb.swiglu_alpha, pb.swiglu_limit};
  run_shared_experts(pb, block_m, ws, act, grown_gemm_scratch(pb, block_m, ws, num_threads),
                     num_threads);
  clock.lap(&StageTimes::shared_us);
  return ws.shared_out.data();
}

void fused_experts(const ExpertsProblem& pb, int64_t block_m, ExpertsWorkspace& ws, int num_threads,
                   StageTimes* times) {
  num_threads = resolve_num_threads(num_threads);
  const float* cache3 = routed_pair_outputs(pb, block_m, ws, num_threads, times);
  const float* shared = shared_expert_outputs(pb, block_m, ws, num_threads, times);
  StageClock clock(times);
  moe_sum(cache3, nullptr, shared, pb.num_tokens, pb.top_k, pb.hidden_size, pb.out, pb.hidden_dtype,
          num_threads);
  clock.lap(&StageTimes::sum_us);
}

}  // namespace moe::cpu
