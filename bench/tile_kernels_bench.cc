// The innermost CPU kernel of each instruction-set path (kernels/cpu/tile_kernel.h) on its own:
// one thread, a block of rows (the path's full block, and shorter ones as the remainders of a
// chunk get) times one panel pair over one k block, with the weights and the inputs hot in L1,
// called over and over. What the layer adds (streaming the weights from
// memory, gathers, epilogues, the work split) is left out, so the counters show how close the
// arithmetic itself comes to the path's measured peak, steadily enough to compare kernel variants
// on a shared host. The k block is the layer's: 16 KiB of a pair (256 k of bf16 or f16, 128 of
// f32); the amx kernel, which the layer gives the whole of k, gets the same 256 here.
//
// Run: build/release/bench/moe_bench_tile_kernels [--benchmark_filter=avx512/bf16/12]
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/tile_kernel.h"
#include "moe/cpu_isa.h"
#include "moe/dtype.h"
#include "tools/moe/experts_sweep.h"

namespace {

// A weight or input value of `dtype` that keeps every sum a normal float (no denormal slow path).
void fill(std::vector<uint8_t>& bytes, moe::DType dtype, float value) {
  const size_t size = moe::dtype_size(dtype);
  std::vector<uint8_t> one(size);
  moe::convert_from_f32(&value, dtype, one.data(), 1);
  for (size_t i = 0; i + size <= bytes.size(); i += size) std::memcpy(&bytes[i], one.data(), size);
}

void tile_kernel(benchmark::State& state, moe::CpuIsa isa, moe::DType weight_dtype) {
  const moe::cpu::ExpertKernels kernels = moe::cpu::expert_kernels(isa, weight_dtype);
  const moe::cpu::TileKernel& kernel = kernels.tile;
  const int64_t weight_bytes = static_cast<int64_t>(moe::dtype_size(weight_dtype));
  const int64_t k = moe::cpu::kPairBlockBytes / (moe::cpu::kPairWidth * weight_bytes);
  const int64_t rows = state.range(0);
  const int64_t padded_rows =
      (rows + kernel.row_multiple - 1) / kernel.row_multiple * kernel.row_multiple;
  const int64_t a_stride = k + 64;  // as the driver's row buffer: a spare cache line or more
  std::vector<uint8_t> a(static_cast<size_t>(padded_rows * a_stride) *
                         moe::dtype_size(kernel.a_dtype));
  std::vector<uint8_t> pair(static_cast<size_t>(2 * k * moe::cpu::kPanelWidth * weight_bytes));
  std::vector<float> acc(static_cast<size_t>(padded_rows * moe::cpu::kPairWidth));
  fill(a, kernel.a_dtype, 0.5f);
  fill(pair, weight_dtype, 0.25f);

  moe::cpu::TileArgs t;
  t.a = a.data();
  t.a_stride = a_stride;
  t.rows = rows;
  t.pair = pair.data();
  t.panel_bytes = static_cast<int64_t>(pair.size() / 2);
  t.k_begin = 0;
  t.k_end = k;
  t.accumulate = true;
  t.prefetch = false;  // the later row blocks' calls: the block is in L1
  t.acc = acc.data();
  const double peak = moe::cli::measure_peak_flops(isa, weight_dtype, 1);
  if (kernel.thread_begin) kernel.thread_begin();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    kernel.run(t);
    benchmark::DoNotOptimize(acc.data());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (kernel.thread_end) kernel.thread_end();
  const double flops = 2.0 * static_cast<double>(rows * moe::cpu::kPairWidth * k) *
                       static_cast<double>(state.iterations());
  state.counters["gflops"] = flops / seconds * 1e-9;
  state.counters["peak_gflops"] = peak * 1e-9;
  state.counters["of_peak"] = flops / seconds / peak;
  state.SetLabel(std::string(moe::cpu_isa_name(isa)) + " " +
                 std::string(moe::dtype_name(weight_dtype)) + ", " + std::to_string(rows) +
                 " rows x 32 x " + std::to_string(k) + " k");
}

// A path's epilogue (epilogue_rows.h) on one block of 32 rows of a panel pair, bf16 out as in a
// bf16 layer: gemm1's SiLU (16 outputs a row) into rows 768 apart, gemm2's scaling (32 a row)
// into rows 2048 apart, as Qwen3-30B-A3B's; sums and outputs stay in L1 and L2. It runs once per
// row and pair, beside 2 x K / 32 tile instructions of 16 cycles each, so its time per row is
// the figure to hold against those (`ns_per_row`).
void epilogue(benchmark::State& state, moe::CpuIsa isa, bool gated) {
  const moe::cpu::ExpertKernels kernels = moe::cpu::expert_kernels(isa, moe::DType::kBF16);
  constexpr int64_t kRows = 32;
  const int64_t out_stride = gated ? 768 : 2048;
  std::vector<float> acc(kRows * moe::cpu::kPairWidth);
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
  std::vector<int32_t> ids(kRows);
  std::vector<float> scale(kRows, 0.125f);
  for (int64_t r = 0; r < kRows; ++r) ids[static_cast<size_t>(r)] = static_cast<int32_t>(r);
  std::vector<uint16_t> out(static_cast<size_t>(kRows * out_stride));
  moe::cpu::EpilogueArgs e;
  e.acc = acc.data();
  e.rows = kRows;
  e.ids = ids.data();
  e.scale = gated ? nullptr : scale.data();
  e.width = gated ? moe::cpu::kPanelWidth : moe::cpu::kPairWidth;
  e.out = out.data();
  e.out_stride = out_stride;
  e.out_dtype = moe::DType::kBF16;
  const moe::cpu::EpilogueRows run = gated ? kernels.silu_rows : kernels.scale_rows;
  for (auto _ : state) {
    run(e);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["ns_per_row"] =
      benchmark::Counter(static_cast<double>(state.iterations() * kRows),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// One case per supported path, weight dtype its kernels take (the bf16-input paths: bf16) and
// block height: every height up to the path's full block, as the remainders of a chunk get them
// (the amx path, whose blocks are padded to 16 rows: 1, 16 and 32).
const bool registered = [] {
  for (moe::CpuIsa isa : moe::supported_cpu_isas()) {
    const bool bf16_only = isa == moe::CpuIsa::kAmx || isa == moe::CpuIsa::kAvx512Bf16;
    for (moe::DType dtype : {moe::DType::kBF16, moe::DType::kF32, moe::DType::kF16}) {
      if (bf16_only && dtype != moe::DType::kBF16) continue;
      const std::string name = "TileKernel/" + std::string(moe::cpu_isa_name(isa)) + "/" +
                               std::string(moe::dtype_name(dtype));
      const moe::cpu::TileKernel kernel = moe::cpu::expert_kernels(isa, dtype).tile;
      auto* bench = benchmark::RegisterBenchmark(name.c_str(), tile_kernel, isa, dtype);
      bench->Arg(1);
      for (int64_t rows = kernel.row_multiple > 1 ? kernel.row_multiple : 2;
           rows <= kernel.max_rows; rows += kernel.row_multiple) {
        bench->Arg(rows);
      }
      bench->MinTime(0.5);
    }
    const moe::cpu::ExpertKernels kernels = moe::cpu::expert_kernels(isa, moe::DType::kBF16);
    for (const bool gated : {true, false}) {
      if ((gated ? kernels.silu_rows : kernels.scale_rows) == nullptr) continue;
      const std::string name = std::string(gated ? "SiluRows/" : "ScaleRows/") +
                               std::string(moe::cpu_isa_name(isa)) + "/bf16";
      benchmark::RegisterBenchmark(name.c_str(), epilogue, isa, gated)->MinTime(0.5);
    }
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
