// The CPU experts pipeline. Stage by stage, as include/moe/experts.h defines it:
//   align   pairs grouped by expert (a counting sort: one group per touched expert)
//   gemm1   cache2[p] = act(hidden[p / k] · w13[e]^T)   act in the epilogue; cache1 never exists
//           (cache2 in gemm2's input dtype: f32, or bf16 for the bf16 kernels; the input row is
//           read at hidden_row_ptrs[p] instead when the problem gives them: expert parallelism)
//   gemm2   cache3[p] = topk_weights[p] * cache2[p] · w2[e]^T   weight in the epilogue
//           (cache3 in bf16 for a bf16 layer, else f32: cache3_dtype in fused_experts.h)
//   shared  the always-on MLP over all tokens, as a one-expert gemm1 and gemm2
//   sum     out[t] = sum_j cache3[t*k + j] + shared[t]
// act_us stays zero: the activation's time is part of gemm1's. Tested by tests/experts against
// the reference backend.
#include "kernels/cpu/fused_experts.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>

#include "kernels/cpu/align_block_size.h"
#include "kernels/cpu/moe_sum.h"
#include "kernels/cpu/threads.h"

namespace moe::cpu {

namespace {

template <typename T>
T* grown(std::vector<T>& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) buffer.resize(static_cast<size_t>(size));
  return buffer.data();
}

constexpr int64_t kCacheLine = 64;

// `bytes` from a cache line on: with H a multiple of 32, each row's 32 values of a panel pair are
// then whole lines (two of f32, one of bf16), which non-temporal stores write without reading
// them first (EpilogueArgs::stream).
void* grown_line_aligned(std::vector<float>& buffer, int64_t bytes) {
  constexpr int64_t kLineFloats = kCacheLine / sizeof(float);
  float* data = grown(buffer, (bytes + 3) / 4 + kLineFloats);
  const int64_t past_line = static_cast<int64_t>(reinterpret_cast<uintptr_t>(data) % kCacheLine);
  return past_line == 0 ? data : data + (kCacheLine - past_line) / sizeof(float);
}

// A cache3 of at least this many bytes is written past the caches: it outgrows the caches before
// the sum reads it (a top-8 model with H = 2048 gets there at 1024 tokens in bf16, 512 in f32),
// and ordinary stores would read each of its lines from memory first.
constexpr int64_t kStreamedCache3Bytes = int64_t{32} << 20;

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

// Groups the pairs by local expert into ws.groups; the pairs of experts that are not local get
// zero rows in cache3 (they contribute nothing to the sum).
void group_pairs(const ExpertsProblem& pb, ExpertsWorkspace& ws) {
  const int64_t num_pairs = pb.num_pairs(), E = pb.num_experts;
  int32_t* sorted = grown(ws.sorted_pair_ids, num_pairs);
  int32_t* block_experts = grown(ws.block_experts, num_pairs);
  int32_t* offsets = grown(ws.expert_offsets, E + 1);
  align_block_size(pb.topk_ids, num_pairs, E, 1, pb.expert_map, sorted, block_experts, offsets);
  ws.groups.clear();
  ws.groups.reserve(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const int32_t rows = offsets[e + 1] - offsets[e];
    if (rows == 0) continue;
    const int32_t local = pb.expert_map ? pb.expert_map[e] : static_cast<int32_t>(e);
    if (local < 0) continue;
    ws.groups.push_back({local, rows, sorted + offsets[e]});
  }
}

// Zero is all bits zero in f32 and bf16 alike.
void zero_non_local_rows(const ExpertsProblem& pb, ExpertsWorkspace& ws, void* cache3,
                         int64_t row_bytes) {
  if (!pb.expert_map) return;
  const int32_t* offsets = ws.expert_offsets.data();
  for (int64_t e = 0; e < pb.num_experts; ++e) {
    if (pb.expert_map[e] >= 0) continue;
    for (int32_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      const int32_t p = ws.sorted_pair_ids[i];
      std::memset(static_cast<char*>(cache3) + p * row_bytes, 0, static_cast<size_t>(row_bytes));
    }
  }
}

// Packs the routed experts this batch touches into the workspace; returns the tables that point
// at them (shared_expert_outputs packs the shared experts).
PackedExpertsView pack_touched(const ExpertsProblem& pb, ExpertsWorkspace& ws, int num_threads) {
  PackedExpertsView v;
  v.w13 = gated_layout(pb.weight_dtype, pb.intermediate_size, pb.hidden_size);
  v.w2 = plain_layout(pb.weight_dtype, pb.hidden_size, pb.intermediate_size);
  ws.local_slot.assign(static_cast<size_t>(pb.num_local_experts), -1);
  ws.touched.clear();
  for (const ExpertRows& group : ws.groups) {
    int32_t& slot = ws.local_slot[group.expert];
    if (slot >= 0) continue;
    slot = static_cast<int32_t>(ws.touched.size());
    ws.touched.push_back(group.expert);
  }
  const int64_t count = static_cast<int64_t>(ws.touched.size());
  const auto ensure = [](Tensor& buffer, int64_t bytes) {
    if (!buffer.defined() || static_cast<int64_t>(buffer.nbytes()) < bytes) {
      buffer = Tensor(DType::kU8, {bytes});
    }
  };
  ensure(ws.packed_w13, count * v.w13.bytes());
  ensure(ws.packed_w2, count * v.w2.bytes());
  pack_matrices(v.w13, pb.w13, count, ws.touched.data(), ws.packed_w13.data<void>(), num_threads);
  pack_matrices(v.w2, pb.w2, count, ws.touched.data(), ws.packed_w2.data<void>(), num_threads);
  ws.w13_table.assign(static_cast<size_t>(pb.num_local_experts), nullptr);
  ws.w2_table.assign(static_cast<size_t>(pb.num_local_experts), nullptr);
  for (int64_t i = 0; i < count; ++i) {
    ws.w13_table[ws.touched[i]] = ws.packed_w13.data<uint8_t>() + i * v.w13.bytes();
    ws.w2_table[ws.touched[i]] = ws.packed_w2.data<uint8_t>() + i * v.w2.bytes();
  }
  v.w13_experts = ws.w13_table.data();
  v.w2_experts = ws.w2_table.data();
  return v;
}

// gate[t] = sigmoid(hidden[t] · shared_gate), products and sums in f32.
void shared_gate_values(const ExpertsProblem& pb, ExpertsWorkspace& ws, float* gate) {
  const int64_t M = pb.num_tokens, H = pb.hidden_size;
  float* row = grown(ws.gate_row, 2 * H);
  float* weights = row + H;
  convert_to_f32(pb.shared_gate, pb.weight_dtype, weights, static_cast<size_t>(H));
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(pb.hidden_dtype);
  for (int64_t t = 0; t < M; ++t) {
    convert_to_f32(static_cast<const char*>(pb.hidden) + t * row_bytes, pb.hidden_dtype, row,
                   static_cast<size_t>(H));
    float dot = 0;
    for (int64_t h = 0; h < H; ++h) dot += row[h] * weights[h];
    gate[t] = 1.0f / (1.0f + std::exp(-dot));
  }
}

void run_shared_experts(const ExpertsProblem& pb, const PackedExpertsView& packed,
                        const ExpertKernels& kernels, int64_t block_m, ExpertsWorkspace& ws,
                        const ActivationParams& act, int num_threads) {
  const int64_t M = pb.num_tokens, H = pb.hidden_size, Is = pb.shared_intermediate_size;
  int32_t* ids = grown(ws.token_ids, M);
  std::iota(ids, ids + M, 0);
  const ExpertRows tokens{0, static_cast<int32_t>(M), ids};

  float* gate = nullptr;
  if (pb.shared_gate) {
    gate = grown(ws.shared_gate, M);
    shared_gate_values(pb, ws, gate);
  }

  PackedGemmArgs up;
  up.a = pb.hidden;
  up.a_dtype = pb.hidden_dtype;
  up.layout = packed.shared_w13;
  up.experts = packed.shared_w13_data;
  up.activation = act;
  up.out = grown(ws.shared_cache2, M * Is);
  up.out_dtype = kernels.tile.a_dtype;
  packed_gemm(up, &tokens, 1, kernels, block_m, ws.gemm, num_threads);

  PackedGemmArgs down;
  down.a = ws.shared_cache2.data();
  down.a_dtype = kernels.tile.a_dtype;
  down.layout = packed.shared_w2;
  down.experts = packed.shared_w2_data;
  down.out_scale = gate;
  down.out = grown(ws.shared_out, M * H);
  packed_gemm(down, &tokens, 1, kernels, block_m, ws.gemm, num_threads);
}

}  // namespace

DType cache3_dtype(DType out_dtype) {
  return out_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

const void* routed_pair_outputs(const ExpertsProblem& pb, const PackedExpertsView* packed,
                                const ExpertKernels& kernels, int64_t block_m, ExpertsWorkspace& ws,
                                int num_threads, StageTimes* times) {
  num_threads = resolve_num_threads(num_threads);
  const int64_t H = pb.hidden_size, I = pb.intermediate_size;
  const int64_t num_pairs = pb.num_pairs();
  const ActivationParams act{pb.activation, pb.swiglu_alpha, pb.swiglu_limit};
  StageClock clock(times);

  group_pairs(pb, ws);
  clock.lap(&StageTimes::align_us);

  const PackedExpertsView weights = packed ? *packed : pack_touched(pb, ws, num_threads);
  const int64_t num_groups = static_cast<int64_t>(ws.groups.size());

  PackedGemmArgs gemm1;
  gemm1.a = pb.hidden;
  gemm1.a_dtype = pb.hidden_dtype;
  gemm1.a_row_divisor = pb.top_k;
  gemm1.a_row_ptrs = pb.hidden_row_ptrs;
  gemm1.a_scale = pb.weight_on_input ? pb.topk_weights : nullptr;
  gemm1.layout = weights.w13;
  gemm1.experts = weights.w13_experts;
  gemm1.bias = pb.w13_bias;
  gemm1.activation = act;
  gemm1.out = grown(ws.cache2, num_pairs * I);
  gemm1.out_dtype = kernels.tile.a_dtype;

  const DType cache3_type = cache3_dtype(pb.hidden_dtype);
  const int64_t cache3_row_bytes = H * static_cast<int64_t>(dtype_size(cache3_type));
  void* cache3 = grown_line_aligned(ws.cache3, num_pairs * cache3_row_bytes);
  PackedGemmArgs gemm2;
  gemm2.a = ws.cache2.data();
  gemm2.a_dtype = kernels.tile.a_dtype;
  gemm2.layout = weights.w2;
  gemm2.experts = weights.w2_experts;
  gemm2.bias = pb.w2_bias;
  gemm2.out_scale = pb.weight_on_input ? nullptr : pb.topk_weights;
  gemm2.out = cache3;
  gemm2.out_dtype = cache3_type;
  gemm2.stream_out = num_pairs * cache3_row_bytes >= kStreamedCache3Bytes;

  // Prefill chunks that one thread takes whole run gemm2 right after gemm1, from rows that never
  // leave the core's caches (timed as gemm1); the rest run gemm2 from cache2 afterwards.
  packed_mlp_prefill(gemm1, gemm2, ws.groups.data(), num_groups, kernels, block_m, ws.gemm,
                     num_threads, ws.gemm2_rest);
  clock.lap(&StageTimes::gemm1_us);
  packed_gemm(gemm2, ws.gemm2_rest.data(), static_cast<int64_t>(ws.gemm2_rest.size()), kernels,
              block_m, ws.gemm, num_threads);
  zero_non_local_rows(pb, ws, cache3, cache3_row_bytes);
  clock.lap(&StageTimes::gemm2_us);
  return cache3;
}

const float* shared_expert_outputs(const ExpertsProblem& pb, const PackedExpertsView* packed,
                                   const ExpertKernels& kernels, int64_t block_m,
                                   ExpertsWorkspace& ws, int num_threads, StageTimes* times) {
  if (pb.shared_intermediate_size == 0 || pb.num_tokens == 0) return nullptr;
  num_threads = resolve_num_threads(num_threads);
  StageClock clock(times);
  PackedExpertsView packed_here;
  if (!packed) {
    ws.packed_shared = PackedExperts::pack_shared(pb, num_threads);
    packed_here = ws.packed_shared.view();
    packed = &packed_here;
  }
  const ActivationParams act{pb.activation, pb.swiglu_alpha, pb.swiglu_limit};
  run_shared_experts(pb, *packed, kernels, block_m, ws, act, num_threads);
  clock.lap(&StageTimes::shared_us);
  return ws.shared_out.data();
}

void fused_experts(const ExpertsProblem& pb, const PackedExpertsView* packed,
                   const ExpertKernels& kernels, int64_t block_m, ExpertsWorkspace& ws,
                   int num_threads, StageTimes* times) {
  num_threads = resolve_num_threads(num_threads);
  const void* cache3 = routed_pair_outputs(pb, packed, kernels, block_m, ws, num_threads, times);
  const float* shared = shared_expert_outputs(pb, packed, kernels, block_m, ws, num_threads, times);
  StageClock clock(times);
  moe_sum(cache3, nullptr, cache3_dtype(pb.hidden_dtype), shared, pb.num_tokens, pb.top_k,
          pb.hidden_size, pb.out, pb.hidden_dtype, num_threads);
  clock.lap(&StageTimes::sum_us);
}

}  // namespace moe::cpu
