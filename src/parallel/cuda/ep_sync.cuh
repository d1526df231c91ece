// Device-side synchronization between GPUs of one host, for the low-latency kernels: flags that
// carry a step number, published with a system-scope release and read with a system-scope
// acquire, and a bounded spin that gives up at a deadline instead of hanging.
//
// A flag is one 64-bit word: the step number in the high 32 bits, a value (a row count) in the
// low 32. Publishing both in one store means a reader that sees the step also sees its count, and
// buffers are reused from step to step without being reset: a stale word carries an older step.
#pragma once

#include <cstdint>

namespace moe::cuda::ep {

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ void store_release_sys(uint64_t* address, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

// A plain (weak, coherent) 16-byte load, for data other GPUs wrote during this kernel and made
// visible by a release this thread (or its block, through __syncthreads) acquired: __ldg's
// non-coherent path is only valid for data that no one writes while the kernel runs.
__device__ __forceinline__ uint4 load_coherent(const uint4* address) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(address)
               : "memory");
  return v;
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__device__ __forceinline__ uint64_t make_flag(uint32_t step, uint32_t value) {
  return (static_cast<uint64_t>(step) << 32) | value;
}
__device__ __forceinline__ uint32_t flag_step(uint64_t flag) {
  return static_cast<uint32_t>(flag >> 32);
}
__device__ __forceinline__ uint32_t flag_value(uint64_t flag) {
  return static_cast<uint32_t>(flag);
}

// Spins until *flag carries `step`; returns it, or 0 with *timed_out set once the global timer
// passes `deadline_ns`. *last_seen keeps the last word read, for the report.
__device__ __forceinline__ uint64_t wait_for_step(const uint64_t* flag, uint32_t step,
                                                  uint64_t deadline_ns, bool* timed_out,
                                                  uint64_t* last_seen) {
  *timed_out = false;
  for (uint32_t spins = 0;; ++spins) {
    const uint64_t seen = load_acquire_sys(flag);
    *last_seen = seen;
    if (flag_step(seen) == step) return seen;
    // The timer is read every 64 polls: it is slower to read than the flag.
    if ((spins & 63) == 63 && global_timer_ns() > deadline_ns) {
      *timed_out = true;
      return 0;
    }
  }
}

}  // namespace moe::cuda::ep
