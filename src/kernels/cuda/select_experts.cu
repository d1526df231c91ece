// One warp per token. Lane l holds the scores of experts l, l + 32, ... (E <= 512: 16 per lane).
// Every "best of" is a warp reduction under one strict total order (larger first, NaN after every
// number, ties to the lower id), so the result does not depend on the reduction's shape and
// matches the CPU kernel's sort.
#include <cmath>

#include "kernels/cuda/check.h"
#include "kernels/cuda/routing.h"

namespace moe::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kPerLane = kMaxRoutedExperts / 32;

struct SelectShape {
  int num_experts, top_k, num_groups, topk_groups;
  bool softmax, renormalize, group_top2;
  float scaling;
};

__device__ __forceinline__ bool ranks_before(float a, int id_a, float b, int id_b) {
  const bool nan_a = isnan(a), nan_b = isnan(b);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && a != b) return a > b;
  return id_a < id_b;
}

// A scored candidate; id < 0 is "none", which every real candidate beats.
struct Ranked {
  float key;
  int id;
  float payload;
  __device__ bool beats(const Ranked& other) const {
    return id >= 0 && (other.id < 0 || ranks_before(key, id, other.key, other.id));
  }
};

__device__ Ranked shuffle_xor(const Ranked& r, int offset) {
  return {__shfl_xor_sync(0xffffffff, r.key, offset), __shfl_xor_sync(0xffffffff, r.id, offset),
          __shfl_xor_sync(0xffffffff, r.payload, offset)};
}

__device__ Ranked warp_best(Ranked r) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const Ranked other = shuffle_xor(r, offset);
    if (other.beats(r)) r = other;
  }
  return r;
}

// Best and second best of a group across the warp.
__device__ void warp_best_two(Ranked& best, Ranked& second) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const Ranked other_best = shuffle_xor(best, offset);
    const Ranked other_second = shuffle_xor(second, offset);
    if (other_best.beats(best)) {
      second = best.beats(other_second) ? best : other_second;
      best = other_best;
    } else if (other_best.beats(second)) {
      second = other_best;
    }
  }
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    select_kernel(SelectShape shape, SelectArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (token >= a.num_tokens) return;
  const int E = shape.num_experts;
  const float* logits = a.logits + token * E;

  float score[kPerLane], selection[kPerLane];
  float max_logit = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    float logit = -INFINITY;
    if (e < E) logit = logits[e] + (a.router_bias != nullptr ? a.router_bias[e] : 0.0f);
    score[i] = logit;
    if (e < E) max_logit = fmaxf(max_logit, logit);  // fmaxf skips NaN, as the CPU's max does
  }
  if (shape.softmax) {
    for (int offset = 16; offset > 0; offset /= 2) {
      max_logit = fmaxf(max_logit, __shfl_xor_sync(0xffffffff, max_logit, offset));
    }
    float sum = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      score[i] = lane + 32 * i < E ? expf(score[i] - max_logit) : 0.0f;
      sum += score[i];
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] /= sum;
  } else {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) score[i] = 1.0f / (1.0f + expf(-score[i]));
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    selection[i] = score[i];
    if (a.correction_bias != nullptr && e < E) selection[i] += a.correction_bias[e];
  }

  // Group limit: keep the topk_groups best groups; experts of the others are never candidates.
  uint32_t kept_groups = 0xffffffffu;
  const int group_size = E / shape.num_groups;
  if (shape.num_groups > 1) {
    float group_score = 0;  // lane g holds group g's
    for (int g = 0; g < shape.num_groups; ++g) {
      Ranked best{0, -1, 0}, second{0, -1, 0};
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int e = lane + 32 * i;
        if (e >= E || e / group_size != g) continue;
        const Ranked r{selection[i], e, 0};
        if (r.beats(best)) {
          second = best;
          best = r;
        } else if (r.beats(second)) {
          second = r;
        }
      }
      warp_best_two(best, second);
      float s = best.key;
      if (shape.group_top2 && second.id >= 0) s += second.key;
      if (lane == g) group_score = s;
    }
    kept_groups = 0;
    for (int round = 0; round < shape.topk_groups; ++round) {
      const bool open = lane < shape.num_groups && !(kept_groups >> lane & 1);
      const Ranked winner = warp_best({group_score, open ? lane : -1, 0});
      kept_groups |= 1u << winner.id;
    }
  }

  uint32_t chosen = 0;  // bit i: expert lane + 32 i already picked
  int my_id = 0;
  float my_weight = 0;
  for (int j = 0; j < shape.top_k; ++j) {
    Ranked best{0, -1, 0};
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e >= E || (chosen >> i & 1) || !(kept_groups >> (e / group_size) & 1)) continue;
      const Ranked r{selection[i], e, score[i]};
      if (r.beats(best)) best = r;
    }
    best = warp_best(best);
    if (best.id % 32 == lane) chosen |= 1u << (best.id / 32);
    if (lane == j) {
      my_id = best.id;
      my_weight = best.payload;
    }
  }
  // Renormalize in slot order, as the CPU does, so the sums round the same way.
  float sum = 0;
  for (int j = 0; j < shape.top_k; ++j) sum += __shfl_sync(0xffffffff, my_weight, j);
  if (lane < shape.top_k) {
    float weight = my_weight;
    if (shape.renormalize && sum > 0) weight /= sum;
    weight *= shape.scaling;
    a.topk_ids[token * shape.top_k + lane] = my_id;
    a.topk_weights[token * shape.top_k + lane] = weight;
    if (a.expert_counts != nullptr) atomicAdd(&a.expert_counts[my_id], 1);
  }
}

}  // namespace

void select_experts(const RoutingConfig& config, const SelectArgs& args, cudaStream_t stream) {
  if (args.num_tokens == 0) return;
  const SelectShape shape{static_cast<int>(config.num_experts),
                          static_cast<int>(config.top_k),
                          static_cast<int>(config.num_groups),
                          static_cast<int>(config.topk_groups),
                          config.scoring == ScoringFunc::kSoftmax,
                          config.renormalize,
                          config.has_correction_bias,
                          config.routed_scaling_factor};
  const int64_t blocks = (args.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  select_kernel<<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(shape, args);
  check_launch("select_experts");
}

}  // namespace moe::cuda
