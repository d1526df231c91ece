// How much of a core's DRAM read stream survives the L2 reads beside it. A prefill layer streams
// each expert's weights from memory once while its tile loads read the rows (and, in chunks of
// two row blocks, the weights a second time) from L2: at 64 rows an expert (1024 tokens of
// Qwen3-30B-A3B) about 4 bytes come from L2 for every byte from memory, at 16 rows (256 tokens)
// about 1.5. Each thread here reads its own 512 MiB buffer line by line, with the layer's
// software prefetch a pair (128 KiB) ahead into L2, and after every 1 KiB of it reads
// range(0)/4 KiB from a 512 KiB buffer of its own that stays in L2. The figures show the
// stream's rate against that ratio; compare `moe bench --tokens 256,1024`'s GB/s column.
//
// bytes_per_second is the stream's rate, l2_bytes_per_second the L2 reads' (Google Benchmark's G is
// 2^30).
//
// Run: build/release/bench/moe_bench_memory [--benchmark_filter=threads:2]
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>

#include <benchmark/benchmark.h>

namespace {

constexpr int64_t kLine = 64;
constexpr int64_t kBlockBytes = 1024;                 // one AMX tile
constexpr int64_t kStreamBytes = int64_t{512} << 20;  // far past the caches
constexpr int64_t kL2Bytes = int64_t{512} << 10;      // well inside a 2 MiB L2
constexpr int64_t kPrefetchAhead = int64_t{128} << 10;
// Consecutive L2 blocks this far apart, so the L2 buffer is read in an order the hardware
// prefetchers do not turn into a stream of their own.
constexpr int64_t kL2BlockStride = 5 * kBlockBytes;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint64_t[], FreeDeleter>;

// Null where the allocation fails.
Buffer filled_buffer(int64_t bytes) {
  Buffer buffer(static_cast<uint64_t*>(std::aligned_alloc(4096, static_cast<size_t>(bytes))));
  if (buffer) std::memset(buffer.get(), 1, static_cast<size_t>(bytes));
  return buffer;
}

// One line as one value, so that a line is one load where the vectors are that wide (as a tile
// row is one); 16 independent sums, so that the loads, not the additions, set the pace.
using Line = uint64_t __attribute__((vector_size(kLine)));
constexpr int64_t kLinesPerBlock = kBlockBytes / kLine;

inline void read_block(const char* block, Line* sums) {
#pragma GCC unroll 16
  for (int64_t line = 0; line < kLinesPerBlock; ++line) {
    sums[line] += *reinterpret_cast<const Line*>(block + line * kLine);
  }
}

void StreamBesideL2Reads(benchmark::State& state) {
  const int64_t l2_quarters = state.range(0);  // L2 bytes per stream byte, in quarters
  const Buffer stream = filled_buffer(kStreamBytes);
  const Buffer l2 = filled_buffer(kL2Bytes);
  if (!stream || !l2) {
    state.SkipWithError("could not allocate the buffers");
    return;
  }
  const char* stream_bytes = reinterpret_cast<const char*>(stream.get());
  const char* l2_bytes = reinterpret_cast<const char*>(l2.get());
  int64_t l2_offset = 0, l2_blocks_read = 0;
  for (auto _ : state) {
    Line sums[kLinesPerBlock] = {};
    int64_t credit = 0;
    for (int64_t offset = 0; offset < kStreamBytes; offset += kBlockBytes) {
      if (offset + kPrefetchAhead < kStreamBytes) {
        for (int64_t line = 0; line < kBlockBytes; line += kLine) {
          __builtin_prefetch(stream_bytes + offset + kPrefetchAhead + line, 0, 2);
        }
      }
      read_block(stream_bytes + offset, sums);
      for (credit += l2_quarters; credit >= 4; credit -= 4) {
        read_block(l2_bytes + l2_offset, sums);
        l2_offset += kL2BlockStride;
        if (l2_offset >= kL2Bytes) l2_offset -= kL2Bytes;
        ++l2_blocks_read;
      }
    }
    // Only their total leaves the loop, so the sums stay in registers throughout.
    Line total = {};
    for (const Line& sum : sums) total += sum;
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(state.iterations() * kStreamBytes);
  state.counters["l2_bytes_per_second"] = benchmark::Counter(
      static_cast<double>(l2_blocks_read * kBlockBytes), benchmark::Counter::kIsRate);
}

void quarters(benchmark::internal::Benchmark* b) {
  for (int64_t q : {0, 2, 4, 6, 8, 12, 16}) b->Arg(q);
  b->ArgName("l2_quarters")->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(StreamBesideL2Reads)->Apply(quarters)->Threads(1);
BENCHMARK(StreamBesideL2Reads)->Apply(quarters)->Threads(2);

}  // namespace

BENCHMARK_MAIN();
