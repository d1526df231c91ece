#include "kernels/cuda/fused_experts.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string>

#include "kernels/cuda/align_block_size.h"
#include "kernels/cuda/alignment.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/decode_experts.h"
#include "kernels/cuda/gather_block_rows.h"
#include "kernels/cuda/moe_sum.h"
#include "kernels/cuda/time_mark.h"
#include "kernels/cuda/tiny_gemm2_sum.h"
#include "moe/align.h"
#include "moe/error.h"

namespace moe::cuda {
namespace {

// record_timeline's buffer: the thread blocks of gemm1, then of gemm2 (GroupedGemmArgs::timeline),
// then the stage marks (ExpertsRunner::StageMarks, in its order).
constexpr int kTimelineMarksWord = 2 * kMaxTimelineBlocks * kTimelineWords;
enum TimelineMark { kMarkStart, kMarkAligned, kMarkGathered, kMarkGemm2Done, kMarkDone, kMarks };
constexpr int kTimelineBufferWords = kTimelineMarksWord + kMarks;

// Rows per expert up to which gemm2 starts behind gemm1 (GroupedGemmArgs::after_previous_grid):
// where it then waits for all of gemm1, and where it waits for each block it reads
// (gemm2_reads_finished_blocks).
constexpr int64_t kDependentGemm2MaxRows = 64;
constexpr int64_t kPerBlockGemm2MaxRows = 128;

int64_t chunk_tokens(const ExpertsProblem& problem) {
  return std::min(problem.num_tokens, kChunkTokens);
}

// Whether gemm1 writes cache2 in block order and gemm2 loads each stage's rows of a block as one
// TMA box instead of gathering them with cp.async: the 128-row tma plans. On the H200 that took
// gemm2 of DeepSeek-V3 at 16384 tokens from 8.0-8.2 to 6.9-7.0 ms; with 64-row blocks of mostly
// padding (Qwen3-30B-A3B at 16 and 64 tokens) loading the whole box cost up to 1.6% (docs/cuda.md).
bool rows_in_block_order(const ExpertsPlan& plan) {
  return plan.block_m == 128 && is_tma_kernel(plan.kernel);
}

// Whether both GEMMs merge an expert's tail (its last block, of at most kTmaTailRows rows, behind a
// full one) into the tile of the block before it (GroupedGemmArgs::merge_tails): tma_dynamic/128,
// the only kernel built to. On an H100 that plan ran 5-6% faster with it at DeepSeek-V3's 4096 and
// 16384 tokens and 6-9% at Qwen3-30B-A3B's 2048 to 8192, level where few experts have a tail;
// tma_eager/128 ran 8-22% slower with it from 4096 tokens on (docs/cuda.md, "Tails merged into the
// tile before them").
bool merges_tails(const ExpertsPlan& plan) {
  return plan.block_m == 128 && plan.kernel == GemmKernel::kTmaDynamic;
}

// Whether gemm1's input rows are first copied into block order (gather_block_rows.h), so that its
// producer loads each stage's rows as one TMA box as gemm2 does: tma_dynamic/128 with I of at least
// kGatherMinIntermediate. The copy costs a pass over the pairs' rows (about 1 ms at DeepSeek-V3's
// 16384 tokens); with it gemm1 ran 7-13% faster there, the layer 2-3% faster at 4096 tokens and
// 4-6% at 16384. gemm1 reads each row once per column tile (2I / 256 of them), so the larger I,
// the more the copy pays: Qwen3-30B-A3B (I 768, tma/128) lost 2-7% with it at 1024 and 16384 tokens
// (0.5-3% faster at 4096), and the static walks lost 2-4% at DeepSeek-V3's 4096 tokens
// (docs/cuda.md, "gemm1's rows copied into block order").
constexpr int64_t kGatherMinIntermediate = 2048;
bool gather_input_first(const ExpertsPlan& plan, const ExpertsProblem& problem) {
  return plan.kernel == GemmKernel::kTmaDynamic && plan.block_m == 128 &&
         problem.intermediate_size >= kGatherMinIntermediate;
}

// Whether gemm2 and the sum of a chunk of `tokens` run as one launch (tiny_gemm2_sum.h): the
// tiny batch's first tokens, where the sum's launch is a tenth of the call (tiny_gemm2_sum.cu).
bool gemm2_with_sum(const ExpertsPlan& plan, int64_t tokens) {
  return plan.tiny_batch && tokens <= kTinySumMaxTokens;
}

// Whether gemm2, where it starts behind gemm1 (kDependentGemm2MaxRows), reads each block's rows
// once gemm1 has written them instead of after all of gemm1 (GroupedGemmArgs::block_done): the
// tma plans, but not where gemm1 may still read cache3 (gather_input_first), which gemm2 writes.
// On the H200 the 128-row plans, whose gemm2 reads the rows by TMA, took 1.4-2.5% less time with
// it at Qwen3-30B-A3B's 1024 tokens (two machines, docs/perf.md).
bool gemm2_reads_finished_blocks(const ExpertsPlan& plan, const ExpertsProblem& problem) {
  return is_tma_kernel(plan.kernel) && !gather_input_first(plan, problem);
}

int64_t max_padded(const ExpertsProblem& problem, const ExpertsPlan& plan) {
  const int64_t pairs = chunk_tokens(problem) * problem.top_k;
  if (plan.tiny_batch) return pairs;
  return max_num_pairs_post_padded(pairs, problem.num_experts, plan.block_m);
}

// Elapsed milliseconds between consecutive events, recorded on the stream around each stage.
class StageClock {
 public:
  explicit StageClock(bool enabled) : enabled_(enabled) {
    if (!enabled_) return;
    for (auto& event : events_) check(cudaEventCreate(&event), "cudaEventCreate");
  }
  ~StageClock() {
    if (!enabled_) return;
    for (auto& event : events_) cudaEventDestroy(event);
  }
  void mark(int stage, cudaStream_t stream) {
    if (enabled_) check(cudaEventRecord(events_[stage], stream), "cudaEventRecord");
  }
  // Microseconds from mark `from` to mark `to` (waits for `to`).
  double us(int from, int to) {
    check(cudaEventSynchronize(events_[to]), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events_[from], events_[to]), "cudaEventElapsedTime");
    return ms * 1000.0;
  }

 private:
  bool enabled_;
  std::array<cudaEvent_t, 5> events_{};
};

// The tensor-core and decode kernels read hidden's and the weights' rows in whole 16-byte chunks
// (a tensor whose data starts at an odd element, a slice say, does not qualify); the stream
// kernel and the tiny batch's gemm2 take any rows.
bool rows_in_16_byte_chunks(const ExpertsProblem& problem) {
  return problem.hidden_size % 8 == 0 && problem.intermediate_size % 8 == 0 &&
         aligned16(problem.hidden) && aligned16(problem.w13) && aligned16(problem.w2);
}

}  // namespace

ExpertsPlan default_plan(const ExpertsProblem& problem) {
  const int64_t pairs = problem.num_pairs();
  const int64_t experts = std::max<int64_t>(problem.num_local_experts, 1);
  const double rows_per_expert = static_cast<double>(pairs) / static_cast<double>(experts);
  // Chosen from sweeps of every plan on an H200 (docs/perf.md), Qwen3-30B-A3B and DeepSeek-V3
  // shapes; the boundaries fell at the same rows per expert for both but the tiny batch's.
  if (pairs * 2 <= problem.num_experts && problem.expert_map == nullptr) {
    // Experts mostly see one pair: the stream kernel, a block per pair, no align. On the H200
    // it beat every other plan up to half a pair per expert (Qwen3-30B-A3B at 8 tokens 128.6-128.8
    // us, tma/64 155.8-156.7; DeepSeek-V3 at 16 tokens 2088-2090, tma_dynamic/64 2147-2152), the
    // decode kernel's one launch included (Qwen3-30B-A3B at 1, 2 and 4 tokens 28.2-28.3,
    // 46.0-46.1 and 83.9-84.0 us against 25.1-25.3, 43.6-43.8 and 74.0; decode_experts.cu).
    // At one pair per expert it lost on both shapes once the tma kernel had caught up:
    // DeepSeek-V3 (32 tokens) 3697-3704 us against tma_dynamic/64's 3238-3239, Qwen3-30B-A3B
    // (16 tokens) 210.2-210.6 against tma/64's 205.2-205.5 (twentieth session): the rule stops at
    // half.
    return {GemmKernel::kStream, 1, true};
  }
  if (!rows_in_16_byte_chunks(problem)) return {GemmKernel::kStream, kMaxStreamRows, false};
  // On Hopper the tma kernel streams each active expert's weights at the stream kernel's speed
  // or better (16 tokens: equal for DeepSeek-V3, 7% faster for Qwen3), so it takes over as soon
  // as the tiny batch ends.
  if (wgmma_available()) {
    // Long rows (DeepSeek-V3's H 7168): weight tiles too large for L2 to hold while the blocks
    // of one expert drift apart, so those layers take the walk whose tiles start in order, each
    // expert column tile first (tma_dynamic). `moe tune` on the H200 (seventh session): 1.6-4%
    // faster than tma/64 at 64-1024 tokens, equal to tma_pair/128 at 4096 and 2% faster at
    // 16384; at Qwen3-30B-A3B's H 2048 it lost to tma at every size.
    const bool in_order = problem.hidden_size >= 4096;
    const GemmKernel kernel = in_order ? GemmKernel::kTmaDynamic : GemmKernel::kTma;
    // 128-row tiles past 56 rows per expert: on the H200 (thirty-sixth session, docs/perf.md)
    // 64-row blocks were faster up to 56 rows (Qwen3-30B-A3B at 832 and 896 tokens 348-355 us
    // against 363-371 for tma/128, DeepSeek-V3 at 1792 tokens 5596 against 5707-5712 for
    // tma_dynamic/128) and slower from 60 (Qwen3-30B-A3B at 960 tokens 379 against 374, at 1024
    // 411-414 against 368-372).
    if (rows_per_expert <= 56) return {kernel, 64, false};
    // Past 96 rows per expert and up to 448 (between 410, where it was measured ahead, and 512,
    // where tma/128 was), at short rows: clusters of two thread blocks that keep step
    // (tma_pair), so that an expert's blocks take each weight tile from L2 together where
    // tma/128's drift apart and may read it again. On an H100 (sixty-sixth session,
    // docs/perf.md) tma/128 ran 2-24% behind the best plan at Qwen3-30B-A3B's 128-256 rows
    // (2048-4096 tokens) and 6-17% at Qwen2-MoE-A2.7B's 137-410 (2048-6144), tma_pair/128 at
    // most 9%; at OLMoE's 192-384 rows tma_pair/128 was 1-6% behind, tma/128 at most 1%. From
    // 512 rows tma/128 was within 5% of the best on all three.
    if (!in_order && rows_per_expert > 96 && rows_per_expert <= 448) {
      return {GemmKernel::kTmaPair, 128, false};
    }
    return {kernel, 128, false};
  }
  if (rows_per_expert <= 1) return {GemmKernel::kStream, 4, false};
  if (rows_per_expert <= 32) return {GemmKernel::kMma, 32, false};
  return {GemmKernel::kMma, rows_per_expert <= 96 ? 64 : 128, false};
}

std::string why_plan_cannot_run(const ExpertsPlan& plan, const ExpertsProblem& problem) {
  if (!plan.tiny_batch && problem.num_experts > kMaxAlignExperts) {
    // Said here, before anything is queued, rather than by the align launch.
    return fmt::format(
        "every plan but the tiny batch aligns its pairs, which on CUDA takes at most {} experts; "
        "got {}",
        kMaxAlignExperts, problem.num_experts);
  }
  if (plan.tiny_batch && (plan.block_m != 1 || problem.expert_map != nullptr)) {
    return fmt::format("the tiny-batch path needs block_m 1 and no expert map; got block_m {}{}",
                       plan.block_m, problem.expert_map != nullptr ? " with an expert map" : "");
  }
  if (plan.kernel == GemmKernel::kDecode) {
    if (!plan.tiny_batch || plan.block_m != 1) {
      return fmt::format("the decode kernel runs tiny batches (block_m 1); got block_m {}{}",
                         plan.block_m, plan.tiny_batch ? "" : " without the tiny batch");
    }
    if (problem.num_tokens > kDecodeMaxTokens) {
      return fmt::format("the decode kernel takes at most {} tokens; got {}", kDecodeMaxTokens,
                         problem.num_tokens);
    }
    if (!rows_in_16_byte_chunks(problem)) {
      return fmt::format(
          "the decode kernel needs H and I multiples of 8 and 16-byte aligned hidden and weights; "
          "got H {}, I {}",
          problem.hidden_size, problem.intermediate_size);
    }
    return {};
  }
  if (plan.kernel == GemmKernel::kStream && (plan.block_m < 1 || plan.block_m > kMaxStreamRows)) {
    return fmt::format("the stream kernel takes block_m in [1, {}]; got {}", kMaxStreamRows,
                       plan.block_m);
  }
  if (plan.kernel == GemmKernel::kWgmma || is_tma_kernel(plan.kernel)) {
    const bool wgmma = plan.kernel == GemmKernel::kWgmma;
    const char* name = wgmma ? "wgmma" : "tma";
    if (!wgmma_available()) return fmt::format("the {} kernel needs a Hopper GPU (sm_90)", name);
    if (wgmma ? !wgmma_supports_block_m(plan.block_m) : !tma_supports_block_m(plan.block_m)) {
      return fmt::format("the {} kernel takes block_m {}; got {}", name,
                         wgmma ? "64 or 128" : "16, 64 or 128", plan.block_m);
    }
  }
  if (plan.kernel != GemmKernel::kStream) {
    if (plan.kernel == GemmKernel::kMma && !mma_supports_block_m(plan.block_m)) {
      return fmt::format("the tensor-core kernel takes block_m 16, 32, 64 or 128; got {}",
                         plan.block_m);
    }
    if (!rows_in_16_byte_chunks(problem)) {
      return fmt::format(
          "the tensor-core kernels need H and I multiples of 8 and 16-byte aligned hidden and "
          "weights; got H {}, I {}",
          problem.hidden_size, problem.intermediate_size);
    }
  }
  return {};
}

void check_plan(const ExpertsPlan& plan, const ExpertsProblem& problem) {
  const std::string reason = why_plan_cannot_run(plan, problem);
  if (!reason.empty()) fail("plan: {}", reason);
}

void ExpertsRunner::reserve(const ExpertsProblem& problem, const ExpertsPlan& plan) {
  const int64_t padded = max_padded(problem, plan);
  const int64_t pairs = chunk_tokens(problem) * problem.top_k;
  sorted_pair_ids_.reserve(std::max<int64_t>(padded, 1) * sizeof(int32_t));
  expert_ids_.reserve(std::max<int64_t>(padded / plan.block_m, 1) * sizeof(int32_t));
  num_pairs_post_padded_.reserve(sizeof(int32_t));
  // gemm1's and gemm2's counters: gemm2 may take tiles while gemm1 still does
  // (after_previous_grid).
  tile_counter_.reserve(2 * kTileCounterWords * sizeof(int32_t));  // one size: allocated once
  if (gemm2_reads_finished_blocks(plan, problem)) {
    const size_t bytes = static_cast<size_t>(padded / plan.block_m + 1) * sizeof(int32_t);
    if (block_done_.capacity() < bytes) {
      block_done_.reserve(bytes);
      block_done_zeroed_ = false;
    }
  }
  if (!plan.tiny_batch) align_scratch_.reserve(align_scratch_bytes(pairs, problem.num_experts));
  if (record_timeline_) timeline_.reserve(kTimelineBufferWords * sizeof(uint64_t));
  const int64_t cache2_rows = rows_in_block_order(plan) ? padded : pairs;
  cache2_.reserve(std::max<int64_t>(cache2_rows * problem.intermediate_size, 1) * 2);
  if (plan.kernel == GemmKernel::kDecode) {
    decode_sync_.reserve(kDecodeSyncWords * sizeof(uint32_t));  // one size: allocated once
  } else if (!gemm2_with_sum(plan, chunk_tokens(problem))) {
    // gather_input_first: gemm1's rows in block order live there until gemm2 overwrites them.
    const int64_t cache3_rows = gather_input_first(plan, problem) ? std::max(pairs, padded) : pairs;
    cache3_.reserve(std::max<int64_t>(cache3_rows * problem.hidden_size, 1) * 2);
  }
}

size_t ExpertsRunner::workspace_bytes() const {
  return sorted_pair_ids_.capacity() + expert_ids_.capacity() + num_pairs_post_padded_.capacity() +
         align_scratch_.capacity() + cache2_.capacity() + cache3_.capacity() +
         tile_counter_.capacity() + decode_sync_.capacity() + block_done_.capacity();
}

ExpertsRunner::Timeline ExpertsRunner::read_timeline(cudaStream_t stream) const {
  constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  Timeline timeline{{}, {kNone, kNone, kNone, kNone, kNone}};
  std::vector<uint64_t> words(timeline_.capacity() / sizeof(uint64_t));
  if (words.empty()) return timeline;
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize(timeline)");
  check(cudaMemcpy(words.data(), timeline_.data(), timeline_.capacity(), cudaMemcpyDeviceToHost),
        "cudaMemcpy(timeline)");
  auto word = [&](int gemm, int block, int i) {
    return words[((gemm - 1) * kMaxTimelineBlocks + block) * kTimelineWords + i];
  };
  const uint64_t* marks = words.data() + kTimelineMarksWord;
  // Times from gemm1's first start (gemm2's when gemm1 recorded none, else the start mark); a
  // word is zero where the last call had no such thread block or mark.
  uint64_t first_start = 0;
  for (int gemm = 1; gemm <= 2 && first_start == 0; ++gemm) {
    for (int block = 0; block < kMaxTimelineBlocks; ++block) {
      const uint64_t start = word(gemm, block, 0);
      if (start != 0 && (first_start == 0 || start < first_start)) first_start = start;
    }
  }
  if (first_start == 0) first_start = marks[kMarkStart];
  // Differences first: nanoseconds since the epoch do not fit a double's mantissa.
  auto since_first = [&](uint64_t ns) {
    return static_cast<double>(static_cast<int64_t>(ns - first_start)) / 1e3;
  };
  for (int gemm = 1; gemm <= 2; ++gemm) {
    for (int block = 0; block < kMaxTimelineBlocks; ++block) {
      if (word(gemm, block, 0) == 0) continue;
      timeline.spans.push_back({gemm, block, since_first(word(gemm, block, 0)),
                                since_first(word(gemm, block, 1)),
                                static_cast<int>(word(gemm, block, 2))});
    }
  }
  auto mark = [&](int i) { return marks[i] == 0 ? kNone : since_first(marks[i]); };
  timeline.marks = {mark(kMarkStart), mark(kMarkAligned), mark(kMarkGathered), mark(kMarkGemm2Done),
                    mark(kMarkDone)};
  return timeline;
}

void ExpertsRunner::run(const ExpertsProblem& problem, const ExpertsPlan& plan, cudaStream_t stream,
                        StageTimes* times) {
  check_plan(plan, problem);
  if (times) *times = StageTimes{};
  if (problem.num_tokens == 0) return;
  reserve(problem, plan);
  if (!tile_counter_zeroed_) {
    // tma_dynamic's launches leave the counters zero; only the fresh buffer needs it.
    check(cudaMemsetAsync(tile_counter_.data(), 0, tile_counter_.capacity(), stream),
          "cudaMemsetAsync(tile counter)");
    tile_counter_zeroed_ = true;
  }
  if (!block_done_zeroed_ && block_done_.capacity() > 0) {
    // gemm2 sets the counts back to zero for the next call; only a fresh buffer needs it.
    check(cudaMemsetAsync(block_done_.data(), 0, block_done_.capacity(), stream),
          "cudaMemsetAsync(block done)");
    block_done_zeroed_ = true;
  }

  if (plan.kernel == GemmKernel::kDecode) {
    if (record_timeline_) {
      // Records nothing: clear what an earlier call's tma plan left.
      check(cudaMemsetAsync(timeline_.data(), 0, timeline_.capacity(), stream),
            "cudaMemsetAsync(timeline)");
    }
    run_decode(problem, stream, times);
    return;
  }

  const int64_t H = problem.hidden_size, I = problem.intermediate_size, k = problem.top_k;
  const int64_t local_experts = problem.num_local_experts;
  auto* sorted = static_cast<int32_t*>(sorted_pair_ids_.data());
  auto* expert_ids = static_cast<int32_t*>(expert_ids_.data());
  auto* num_padded = static_cast<int32_t*>(num_pairs_post_padded_.data());

  for (int64_t t0 = 0; t0 < problem.num_tokens; t0 += kChunkTokens) {
    const int64_t m = std::min(kChunkTokens, problem.num_tokens - t0);
    const int64_t pairs = m * k;
    const int32_t* topk_ids = problem.topk_ids + t0 * k;
    StageClock clock(times != nullptr);
    auto* timeline = static_cast<uint64_t*>(timeline_.data());
    auto time_mark = [&](int i) {
      if (record_timeline_) record_time_mark(timeline + kTimelineMarksWord + i, stream);
    };
    if (record_timeline_) {
      // Zeroed, so that thread blocks a smaller grid leaves out, and stages this call does not
      // run, read as none.
      check(cudaMemsetAsync(timeline, 0, timeline_.capacity(), stream),
            "cudaMemsetAsync(timeline)");
    }

    // The tiny-batch layout is the identity, so the GEMMs read topk_ids directly: no launch.
    clock.mark(0, stream);
    time_mark(kMarkStart);
    if (!plan.tiny_batch) {
      align_block_size(
          {topk_ids, problem.expert_map, pairs, problem.num_experts, local_experts, plan.block_m,
           sorted, expert_ids, num_padded, static_cast<int32_t*>(align_scratch_.data())},
          stream);
    }
    clock.mark(1, stream);
    time_mark(kMarkAligned);

    const int64_t max_blocks =
        (plan.tiny_batch ? pairs
                         : max_num_pairs_post_padded(pairs, problem.num_experts, plan.block_m)) /
        plan.block_m;
    GroupedGemmArgs gemm;
    gemm.sorted_pair_ids = sorted;
    gemm.expert_ids = expert_ids;
    gemm.num_pairs_post_padded = num_padded;
    gemm.num_pairs = pairs;
    gemm.block_m = plan.block_m;
    gemm.max_blocks = max_blocks;
    gemm.max_multiprocessors = plan.max_multiprocessors;
    gemm.tile_counter = static_cast<int32_t*>(tile_counter_.data());
    gemm.num_local_experts = local_experts;
    gemm.merge_tails = merges_tails(plan);
    if (plan.tiny_batch) {
      gemm.tiny_topk_ids = topk_ids;
      gemm.expert_map = problem.expert_map;
      gemm.num_experts = problem.num_experts;
    }

    gemm.input = static_cast<const uint16_t*>(problem.hidden) + t0 * H;
    gemm.row_divisor = k;
    if (gather_input_first(plan, problem)) {
      // Timed as part of gemm1.
      gather_block_rows({gemm.input, sorted, expert_ids, num_padded, max_blocks * plan.block_m,
                         pairs, k, plan.block_m, local_experts, H, cache3_.data()},
                        stream);
      time_mark(kMarkGathered);
      gemm.input = cache3_.data();
      gemm.row_divisor = 1;
      gemm.input_in_block_order = true;
    }
    gemm.weights = problem.w13;
    gemm.weight_rows = 2 * I;
    gemm.k_dim = H;
    gemm.out_columns = I;
    gemm.out = cache2_.data();
    gemm.out_in_block_order = rows_in_block_order(plan);
    gemm.topk_weights = nullptr;
    const bool reads_finished_blocks = gemm2_reads_finished_blocks(plan, problem);
    const int64_t dependent_max_rows =
        reads_finished_blocks ? kPerBlockGemm2MaxRows : kDependentGemm2MaxRows;
    const bool dependent_gemm2 = !gemm2_with_sum(plan, m) && is_tma_kernel(plan.kernel) &&
                                 pairs <= dependent_max_rows * std::max<int64_t>(local_experts, 1);
    const bool per_block = dependent_gemm2 && reads_finished_blocks;
    if (per_block) gemm.block_done = static_cast<int32_t*>(block_done_.data());
    if (record_timeline_) gemm.timeline = timeline;
    grouped_gemm(plan.kernel, /*gated=*/true, gemm, stream);
    clock.mark(2, stream);

    if (gemm2_with_sum(plan, m)) {
      // Its time is gemm2's; the sum's reads zero.
      tiny_gemm2_sum(
          {cache2_.data(), problem.w2, problem.topk_weights + t0 * k, topk_ids, problem.num_experts,
           m, k, H, I, static_cast<uint16_t*>(problem.out) + t0 * H},
          stream);
      clock.mark(3, stream);
      time_mark(kMarkGemm2Done);
    } else {
      gemm.input = cache2_.data();
      gemm.row_divisor = 1;
      gemm.out_in_block_order = false;
      gemm.input_in_block_order = rows_in_block_order(plan);
      gemm.weights = problem.w2;
      gemm.weight_rows = H;
      gemm.k_dim = I;
      gemm.out_columns = H;
      gemm.out = cache3_.data();
      gemm.topk_weights = problem.topk_weights + t0 * k;
      gemm.tile_counter = static_cast<int32_t*>(tile_counter_.data()) + kTileCounterWords;
      // Its weights stream in while gemm1's last tiles finish (grouped_gemm.h). On the H200 that
      // took 3-8 us off Qwen3-30B-A3B's 16-1024 tokens and 4-30 off DeepSeek-V3's 64-1024 (up to
      // 64 rows per expert); past that, waiting for all of gemm1, it measured 48-65 us slower in
      // one session and 11-38 us faster in the next at Qwen3-30B-A3B's 4096 tokens (256 rows,
      // power-capped), and within the spread at 128 and 512 rows. Waiting per block, it took
      // 0.5-3.8% off Qwen3-30B-A3B's 1536 and 2048 tokens (96 and 128 rows) and was lost in the
      // spread at 4096-16384 (docs/perf.md), so it goes as far as measured faster.
      gemm.after_previous_grid = dependent_gemm2;
      if (per_block) {
        gemm.block_done_target = static_cast<int32_t>((I + kTmaGatedColumnsPerTile - 1) /
                                                      kTmaGatedColumnsPerTile * kTmaConsumerWarps);
      }
      if (record_timeline_) gemm.timeline = timeline + kMaxTimelineBlocks * kTimelineWords;
      grouped_gemm(plan.kernel, /*gated=*/false, gemm, stream);
      clock.mark(3, stream);
      time_mark(kMarkGemm2Done);

      SumArgs sum{cache3_.data(),
                  topk_ids,
                  problem.expert_map,
                  problem.num_experts,
                  local_experts,
                  m,
                  k,
                  H,
                  static_cast<uint16_t*>(problem.out) + t0 * H};
      moe_sum(sum, stream);
    }
    clock.mark(4, stream);
    time_mark(kMarkDone);

    if (times) {
      times->align_us += clock.us(0, 1);
      times->gemm1_us += clock.us(1, 2);
      times->gemm2_us += clock.us(2, 3);
      times->sum_us += clock.us(3, 4);
    }
  }
}

void ExpertsRunner::run_decode(const ExpertsProblem& problem, cudaStream_t stream,
                               StageTimes* times) {
  auto* sync = static_cast<uint32_t*>(decode_sync_.data());
  if (!decode_sync_zeroed_) {
    // Launches leave the counters zero; only the fresh buffer needs it.
    check(cudaMemsetAsync(sync, 0, decode_sync_.capacity(), stream), "cudaMemsetAsync(decode)");
    decode_sync_zeroed_ = true;
  }
  DecodeArgs args;
  args.hidden = problem.hidden;
  args.w13 = problem.w13;
  args.w2 = problem.w2;
  args.topk_weights = problem.topk_weights;
  args.topk_ids = problem.topk_ids;
  args.num_tokens = problem.num_tokens;
  args.top_k = problem.top_k;
  args.num_experts = problem.num_experts;
  args.hidden_size = problem.hidden_size;
  args.intermediate_size = problem.intermediate_size;
  args.act = cache2_.data();
  args.sync = sync;
  args.out = problem.out;
  StageClock clock(times != nullptr);
  clock.mark(0, stream);
  decode_experts(args, stream);
  clock.mark(1, stream);
  if (times) times->gemm1_us = clock.us(0, 1);
}

}  // namespace moe::cuda
