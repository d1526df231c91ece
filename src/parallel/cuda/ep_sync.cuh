// Device-side synchronization between GPUs of one host, for the low-latency kernels: flags that
// carry a step number, published with a system-scope release and read with a system-scope
// acquire, a bounded spin that gives up at a deadline instead of hanging, and what a wait that
// failed records in the Status.
//
// A flag is one 64-bit word: the step number in the high 32 bits, a value (a row count) in the
// low 32. Publishing both in one store means a reader that sees the step also sees its count, and
// buffers are reused from step to step without being reset: a stale word carries an older step.
#pragma once

#include <cstdint>

#include "kernels/cuda/global_timer.cuh"
#include "parallel/cuda/ep_status.h"

namespace moe::cuda::ep {

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

// A strong store with no ordering of its own. After a fence.sc.sys (__threadfence_system) it
// forms a release pattern in the PTX memory model: one fence then several flags, where a
// st.release.sys per flag would fence again before each (about half a microsecond apiece on two
// H200s: the last block of dispatch_send took 2.8-3.1 us from its fence to its last flag with
// two of them, 1.8-2.1 us with this).
__device__ __forceinline__ void store_relaxed_sys(uint64_t* address, uint64_t value) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
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

// Sets an error bit; the status keeps the step of the first.
__device__ __forceinline__ void note_error(Status* status, uint32_t bit, uint32_t step) {
  atomicOr(&status->bits, bit);
  atomicCAS(&status->step, 0u, step);
}

// A wait for `peer`'s flag of `step` that timed out (bit: the stage's); the first one records what
// it expected and the word it last saw.
__device__ __forceinline__ void note_timeout(Status* status, int peer, uint32_t step, uint64_t seen,
                                             uint32_t bit) {
  if (atomicCAS(&status->timeout_peer, -1, peer) == -1) {
    status->timeout_expected_step = step;
    status->timeout_last_flag = seen;
  }
  note_error(status, bit, step);
}

// One thread's bounded wait for `peer`'s combine flag of `step`. Records a timeout, or an overflow
// the peer saw in this step that this rank did not see itself (so every rank fails the step).
// Returns whether the flag came.
__device__ __forceinline__ bool wait_for_combine_flag(const uint64_t* flag, int peer, uint32_t step,
                                                      uint64_t timeout_ns, Status* status) {
  bool timed_out = false;
  uint64_t seen = 0;
  const uint64_t word =
      wait_for_step(flag, step, global_timer_ns() + timeout_ns, &timed_out, &seen);
  if (timed_out) {
    note_timeout(status, peer, step, seen, kStatusCombineTimeout);
    return false;
  }
  if ((flag_value(word) & kOverflowSeenBit) != 0 && (status->bits & kStatusOverflow) == 0) {
    atomicCAS(&status->overflow_reported_by, -1, peer);
    note_error(status, kStatusPeerOverflow, step);
  }
  return true;
}

}  // namespace moe::cuda::ep
