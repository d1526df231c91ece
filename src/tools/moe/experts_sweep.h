// The measurements behind `moe bench` and bench/experts_bench.cc: this machine's streaming-read
// bandwidth and each path's peak, measured on the thread count of the run, and timed experts
// calls on uniform random (or balanced) routings next to the floor those ceilings imply:
//   floor = max(bytes of the distinct experts touched / bandwidth, flops / peak of the path)
#pragma once

#include <cstdint>
#include <vector>

#include "moe/cpu_isa.h"
#include "moe/layer.h"
#include "moe/tensor.h"

namespace moe::cli {

// GB/s of `threads` threads each summing its share of a `bytes` buffer (touched beforehand), best
// of `passes` passes: what the experts kernels can hope to stream.
double measure_read_bandwidth(int threads, int64_t bytes, int passes);

// FLOP/s of the path's multiply-add (or dot-product, or tile) instruction on `threads` threads at
// once, best of a few runs (tile_kernel.h's peak loops).
double measure_peak_flops(CpuIsa isa, DType weight_dtype, int threads);

// Uniform random top-k routing of `tokens` tokens: k distinct experts each, weights summing to 1.
struct Routing {
  Tensor ids;      // [tokens, k] int32
  Tensor weights;  // [tokens, k] f32
  int64_t experts_touched = 0;
  int64_t rows_min = 0, rows_max = 0;  // pairs per touched expert
  double rows_mean = 0;
};
Routing uniform_routing(int64_t tokens, int64_t num_experts, int64_t top_k, uint64_t seed);

// Balanced top-k routing: pair p goes to expert (first + p) mod E, so every expert gets the same
// number of pairs to within one and a token's k experts are distinct (k <= E); weights 1/k. It
// takes the padding and the spread of real routings out of a timing. `first` moves from routing
// to routing, so that small batches touch other experts each time.
int32_t balanced_expert(int64_t first, int64_t pair, int64_t num_experts);
Routing balanced_routing(int64_t tokens, int64_t num_experts, int64_t top_k, int64_t first);

// Bytes the experts of one call must read (each touched expert once, plus the shared experts)
// and the flops they do (2 per multiply-add), in `weight_dtype`.
struct ExpertsWork {
  double bytes = 0;
  double flops = 0;
};
ExpertsWork experts_work(const MoeConfig& config, DType weight_dtype, int64_t tokens,
                         int64_t experts_touched);

struct SweepSettings {
  int64_t tokens = 1;
  int repeats = 5;       // timed calls; the median is reported
  double budget_s = 30;  // no call starts after this much time (one always runs)
  uint64_t seed = 0;
  bool balanced = false;  // balanced_routing instead of uniform_routing
  DType hidden_dtype = DType::kBF16;
  double bandwidth_gb_s = 0;  // measured in the same run
};

struct SweepPoint {
  int64_t tokens = 0;
  int repeats = 0;
  double ms = 0;                // median time of one layer's experts (align, GEMMs, sum)
  double floor_ms = 0;          // median over the same calls
  bool bandwidth_bound = true;  // the floor is the bytes term
  double bytes = 0, flops = 0;  // of the median call
  int64_t experts_touched = 0;
  int64_t rows_min = 0, rows_max = 0;
  double rows_mean = 0;
  double fraction() const { return ms > 0 ? floor_ms / ms : 0; }
};

// Times forward_experts on one or more variants of a layer (e.g. instruction-set paths, each with
// the peak of its path and its copies: the same layer packed several times, taken in turn so that
// each call streams weights that are not in cache, as in a model of many layers). Every round gives
// each variant one call on the same new routing, in an order rotated every round, so a host whose
// speed drifts (shared machines: up to 1.6x between runs minutes apart) slows them alike.
// ratio_to_first: the median over rounds of a variant's time over the first variant's in the same
// round.
struct InterleavedPoint {
  SweepPoint point;
  double ratio_to_first = 1;
};
std::vector<InterleavedPoint> measure_interleaved(
    const std::vector<std::vector<MoeLayer>*>& variants, const std::vector<double>& peak_flops,
    const SweepSettings& settings);

}  // namespace moe::cli
