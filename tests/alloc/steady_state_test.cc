// No allocation in the steady state: once a layer has run its largest batch, further batches of
// any size up to that (any routing, with or without replicas, through forward or forward_experts)
// allocate nothing. Every allocation of the process is counted while the batches run: operator
// new always, and malloc and its relatives too where no sanitizer owns them.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <new>
#include <vector>

#include "common/random_tensors.h"
#include "moe/config.h"
#include "moe/cpu_isa.h"
#include "moe/layer.h"

namespace {

std::atomic<bool> counting{false};
std::atomic<int64_t> allocations{0};

void note_allocation() {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
}

void* counted_new(std::size_t size) {
  note_allocation();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}

void* counted_aligned_new(std::size_t size, std::align_val_t alignment) {
  note_allocation();
  const std::size_t align = static_cast<std::size_t>(alignment);
  const std::size_t rounded = (size + align - 1) / align * align;
  if (void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(std::size_t size) { return counted_new(size); }
void* operator new[](std::size_t size) { return counted_new(size); }
void* operator new(std::size_t size, std::align_val_t a) { return counted_aligned_new(size, a); }
void* operator new[](std::size_t size, std::align_val_t a) { return counted_aligned_new(size, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

// glibc's allocator under its internal names: malloc and friends are counted, then forwarded
// (tensors use aligned_alloc, OpenMP's runtime malloc). Sanitizers replace malloc themselves.
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__) && defined(__GLIBC__)
extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t count, std::size_t size);
void* __libc_realloc(void* p, std::size_t size);
void* __libc_memalign(std::size_t alignment, std::size_t size);

void* malloc(std::size_t size) {
  note_allocation();
  return __libc_malloc(size);
}
void* calloc(std::size_t count, std::size_t size) {
  note_allocation();
  return __libc_calloc(count, size);
}
void* realloc(void* p, std::size_t size) {
  note_allocation();
  return __libc_realloc(p, size);
}
void* aligned_alloc(std::size_t alignment, std::size_t size) {
  note_allocation();
  return __libc_memalign(alignment, size);
}
void* memalign(std::size_t alignment, std::size_t size) {
  note_allocation();
  return __libc_memalign(alignment, size);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t size) {
  note_allocation();
  void* p = __libc_memalign(alignment, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
}
#endif

namespace moe {
namespace {

// Allocations made by `body`, counted on every thread.
template <typename Body>
int64_t allocations_in(Body body) {
  allocations = 0;
  counting = true;
  body();
  counting = false;
  return allocations.load();
}

TEST(SteadyState, CountingSeesAllocations) {
  // The counter itself works: a vector and a tensor are counted.
  EXPECT_GE(allocations_in([] { std::vector<int> v(1000); }), 1);
  EXPECT_GE(allocations_in([] { Tensor t(DType::kF32, {100}); }), 1);
}

MoeConfig small_shared_config() {
  // Qwen2-MoE's routing with a gated shared expert, at sizes that run in milliseconds.
  MoeConfig c = preset_config("qwen2-moe-a2.7b");
  c.experts.hidden_size = 96;
  c.experts.intermediate_size = 40;
  c.experts.shared_intermediate_size = 72;
  c.routing.num_experts = 20;
  c.routing.top_k = 4;
  return c;
}

void expect_no_allocation_after_warm_up(CpuIsa isa, bool replicas) {
  SCOPED_TRACE(std::string(cpu_isa_name(isa)) + (replicas ? " with replicas" : ""));
  const MoeConfig config = small_shared_config();
  const int64_t H = config.experts.hidden_size, k = config.routing.top_k;
  MoeLayer layer(config, synthetic_layer_weights(config, DType::kBF16, 3),
                 LayerOptions{Backend::kCpu, 2, 0, isa});
  if (replicas) {
    std::vector<int32_t> slots;
    for (int32_t e = 0; e < config.routing.num_experts; ++e) slots.push_back(e);
    for (int32_t e : {0, 5, 5, 11}) slots.push_back(e);
    layer.set_replicas(slots);
  }
  const std::vector<int64_t> sizes = {80, 1, 17, 80, 3, 0, 64};
  std::vector<Tensor> hidden, out, ids, weights;
  for (size_t i = 0; i < sizes.size(); ++i) {
    hidden.push_back(testing::random_normal(DType::kBF16, {sizes[i], H}, 40 + i));
    out.emplace_back(DType::kBF16, Shape{sizes[i], H});
    ids.emplace_back(DType::kI32, Shape{sizes[i], k});
    weights.emplace_back(DType::kF32, Shape{sizes[i], k});
    // A routing unlike the router's: every token on experts t, t+1, ... (mod E).
    for (int64_t p = 0; p < sizes[i] * k; ++p) {
      ids.back().data<int32_t>()[p] =
          static_cast<int32_t>((p / k + p % k) % config.routing.num_experts);
      weights.back().data<float>()[p] = 1.0f / static_cast<float>(k);
    }
  }
  // Views made up front: a view holds its shape in a vector, which is the caller's allocation.
  const std::vector<TensorView> hidden_views(hidden.begin(), hidden.end());
  const std::vector<TensorView> out_views(out.begin(), out.end());
  const std::vector<TensorView> id_views(ids.begin(), ids.end());
  const std::vector<TensorView> weight_views(weights.begin(), weights.end());
  // Warm-up: the largest batch, through both entry points.
  layer.forward(hidden_views[0], out_views[0]);
  layer.forward_experts(hidden_views[0], id_views[0], weight_views[0], out_views[0]);

  const int64_t count = allocations_in([&] {
    for (int repeat = 0; repeat < 3; ++repeat) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        layer.forward(hidden_views[i], out_views[i]);
        layer.forward_experts(hidden_views[i], id_views[i], weight_views[i], out_views[i]);
      }
    }
  });
  EXPECT_EQ(count, 0) << "allocations in the steady state";
}

TEST(SteadyState, MoeLayerAllocatesNothingAfterItsLargestBatch) {
  for (CpuIsa isa : supported_cpu_isas()) {
    for (bool replicas : {false, true}) expect_no_allocation_after_warm_up(isa, replicas);
  }
}

}  // namespace
}  // namespace moe
