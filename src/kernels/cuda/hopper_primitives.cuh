// The Hopper (sm_90a) instructions the warp-specialized grouped GEMM (grouped_gemm_tma.cu) is
// built from: mbarriers, TMA box loads, cluster arrivals and synchronization, programmatic
// dependent launch, acquire loads, proxy fences and register reallocation between warpgroups.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/wgmma.cuh"

namespace moe::cuda {

#ifdef MOE_HAS_WGMMA
__device__ __forceinline__ void barrier_init(uint32_t barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals));
}

// Spins until the phase of `barrier` with parity `parity` has completed (acquire, CTA scope).
__device__ __forceinline__ void barrier_wait(uint32_t barrier, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n"
        "}\n"
        : "=r"(done)
        : "r"(barrier), "r"(parity)
        : "memory");
  } while (done == 0);
}

__device__ __forceinline__ void barrier_arrive(uint32_t barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}

// One arrival that also expects `bytes` of TMA transactions before the phase can complete.
__device__ __forceinline__ void barrier_arrive_expect_bytes(uint32_t barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes)
               : "memory");
}

// An arrival made once all cp.async copies this thread issued so far have landed. noinc: it is
// one of the arrivals the barrier was initialized to expect.
__device__ __forceinline__ void barrier_arrive_after_copies(uint32_t barrier) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barrier) : "memory");
}

// The box at (k, row, expert) of a 3-D tensor map (the weights; the map sets the box's shape) into
// shared memory; completes its bytes on `barrier`. Rows or k past the tensor's end are zeros.
__device__ __forceinline__ void load_weight_box(uint32_t shared, const CUtensorMap* map, int k,
                                                int row, int expert, uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(shared),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(expert), "r"(barrier)
      : "memory");
}

// The box at (k, row) of a 2-D tensor map (the input rows) into shared memory, as load_weight_box.
__device__ __forceinline__ void load_input_box(uint32_t shared, const CUtensorMap* map, int k,
                                               int row, uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(shared),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(barrier)
      : "memory");
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// One arrival on the barrier at the shared offset `barrier` of thread block `rank` of the cluster.
// CTA scope: it only tells the other block's producer that this block is done with a stage; with
// cluster-scope release semantics every arrival waited for this thread's earlier global stores,
// which made the cluster kernels 1.5x slower.
__device__ __forceinline__ void barrier_arrive_in(uint32_t barrier, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(barrier),
      "r"(rank)
      : "memory");
}

// Every thread of every thread block of the cluster: release what came before, acquire theirs.
__device__ __forceinline__ void cluster_sync() {
  asm volatile(
      "barrier.cluster.arrive.release;\n"
      "barrier.cluster.wait.acquire;\n" ::
          : "memory");
}

// Programmatic dependent launch: the next kernel of the stream, if launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, may start once every thread block of this
// one has said so or exited; it sees this one's writes only after wait_for_previous_grid.
__device__ __forceinline__ void allow_dependent_launch() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void wait_for_previous_grid() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

// A load that orders this thread's later reads after it (GPU scope): block_done's counts.
__device__ __forceinline__ int32_t load_acquire(const int32_t* address) {
  int32_t value;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// Orders this thread's global accesses through the generic proxy (plain stores, acquire loads)
// with its later ones through the async proxy (TMA): gemm1's stores of cache2 in block order, which
// gemm2 reads by TMA box once block_done says they are there.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

template <int kRegisters>
__device__ __forceinline__ void shrink_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void grow_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

__device__ __forceinline__ uint32_t multiprocessor_id() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}
#endif

}  // namespace moe::cuda
