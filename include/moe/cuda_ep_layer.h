// CudaEpLayer: one MoE layer with expert parallelism across the GPUs of one host, one process per
// GPU (launched by mpirun), every tensor on the device. In the library target moe::cuda_ep
// (CMake option MOE_WITH_CUDA_EP: CUDA, MPI and NCCL found).
//
//   route     cuBLAS router GEMM + fused top-k on this rank's tokens (as the CUDA MoeLayer)
//   choose    where experts have replicas, the slot serving each pair, on the GPU, by the CPU
//             path's rule (moe/ep_layer.h): a replica on this rank, else on its host, else any;
//             among several, the expert's n-th pair takes candidate (n + rank) mod count
//   dispatch  each token row once per rank that serves one of its pairs, with its k slot ids
//             (other ranks' slots as -1) and router weights
//   experts   the CUDA experts (align, gemm1, gemm2, sum) on the received rows in place, with
//             this rank's expert map: the result is one partial row per (token, serving rank),
//             the sum of that token's pairs served here in ascending j
//   combine   each partial row back to its source, which adds them in ascending rank order;
//             peer to peer the source reads them from the serving ranks' buffers in place
//   shared    where the config has shared experts (DeepSeek-V3, Qwen2-MoE): their MLP on this
//             rank's own tokens, added to the combined rows (every rank holds the shared weights,
//             as the CPU EpMoeLayer does)
//
// Two data paths, after DeepEP's two modes:
//   low-latency      (decode) peer-to-peer writes (dispatch) and reads (combine) over NVLink in
//                    buffers allocated once per rank for `low_latency_capacity` rows per (source,
//                    destination) and mapped by every peer through CUDA IPC; counts published
//                    with flags that carry a step number, waited for on the GPU. No host
//                    synchronization: the step can be captured in a CUDA graph. Overflow of the
//                    capacity and peers that stop answering are reported after the step with
//                    counts, never dropped or hung on.
//   high-throughput  (prefill) on one host whose GPUs all reach each other peer to peer: the
//                    same peer-to-peer kernels, the buffers grown collectively to the most tokens
//                    a rank has in a step (the ranks all-gather their token counts on the host,
//                    no device synchronization). Otherwise (across hosts, no P2P, or
//                    high_throughput_over_nccl): counts through the host communicator, then exact
//                    all-to-alls of rows, ids and weights through the device communicator (NCCL),
//                    which synchronizes the host once per step for the counts.
//
// The output equals the single-GPU CUDA layer's within bf16 rounding, not bitwise: each partial
// row is rounded to bf16 before the source adds it, and the experts may choose another kernel
// plan for the rows they see (docs/parallel-cuda.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "moe/communicator.h"
#include "moe/config.h"
#include "moe/ep_layer.h"
#include "moe/expert_map.h"
#include "moe/layer.h"
#include "moe/tensor.h"

namespace moe {

struct CudaEpOptions {
  DispatcherKind dispatcher = DispatcherKind::kLowLatency;  // moe/ep_layer.h
  // Low-latency: the most token rows one rank sends another per step. A rank never sends one
  // peer more rows than it has tokens, so the most tokens per rank never overflows.
  int64_t low_latency_capacity = 128;
  // Bound of every wait on a peer on the device (peer-to-peer paths); past it the step fails.
  std::chrono::milliseconds timeout{10000};
  // High-throughput: NCCL even where every GPU reaches every other peer to peer (tests, and
  // comparing the two transports).
  bool high_throughput_over_nccl = false;
  int64_t block_m = 0;  // experts' rows per block; 0 = the CUDA backend's choice
  // Two-batch overlap: a second stream with its own data-path buffers (flags, step numbers,
  // IPC mappings) and experts' workspace, for forward_two_batch and friends. A collective
  // choice: every rank passes the same.
  bool two_batch_overlap = false;
  // In two-batch steps, multiprocessors the experts' persistent GEMM grids leave to the other
  // micro-batch's dispatch and combine kernels (which otherwise wait for them); 0 = none.
  int overlap_free_multiprocessors = 0;
};

// What the last step did on this rank. Per-peer arrays are [num_ranks]; this rank's own rows go
// through the same path (a copy within its GPU) and are counted under its own index.
struct CudaEpStats {
  int64_t num_tokens = 0;
  std::vector<int64_t> rows_sent;      // token rows to each rank (one per token and rank)
  std::vector<int64_t> rows_received;  // token rows from each rank
  // Bytes to and from each rank: a token row with its k slot ids and weights out (H * 2 + k * 8),
  // a partial row back (H * 2) for every row received; its own index is the copy within its GPU.
  std::vector<int64_t> bytes_sent, bytes_received;
  TrafficSplit sent, received;  // the same by domain (moe/ep_layer.h): self, same host, cross host
  int64_t bytes_to_peers = 0;   // sent.same_host + sent.cross_host
  // Pairs each of this rank's slots served, in its local slot order: counted only in steps run
  // with count_served_pairs(true), empty otherwise.
  std::vector<int64_t> pairs_per_local_slot;
  // GPU times of the stages in microseconds (forward / forward_routed only; two-batch steps have
  // route and total only: their stages overlap). shared_us stays 0 without shared experts.
  double route_us = 0, dispatch_us = 0, experts_us = 0, combine_us = 0, shared_us = 0, total_us = 0;
};

class CudaEpLayer {
 public:
  // The layer of rank host.rank() on the current CUDA device. local_weights: router [E, H] bf16
  // (and its biases); w13 [L, 2I, H] and w2 [L, H, I] bf16 for this rank's L slots
  // (local_layer_weights in moe/ep_layer.h); the shared experts' bf16 weights where the config
  // has them, whole on every rank. `host` is a host-memory communicator (MPI) of the
  // ranks: it bootstraps the IPC buffers and carries the high-throughput counts; `device` (NCCL, on
  // this device) moves the high-throughput rows where they cannot go peer to peer, and may be
  // null for the low-latency path (and for the high-throughput one on a P2P host). Both must
  // outlive the layer, and every rank constructs it (a collective). The map may hold replicas
  // (EPLB). Throws moe::Error on what the GPU path does not run: more than 8 ranks (low-latency),
  // ranks on several hosts (low-latency), H not a multiple of 8, more than 8192 slots, or what the
  // CUDA MoeLayer refuses.
  CudaEpLayer(MoeConfig config, const LayerWeights& local_weights, ExpertMap map,
              Communicator& host, Communicator* device, CudaEpOptions options = {});
  // The same with this rank's expert weights drawn on the GPU (benchmarks of large shapes), the
  // router too: N(0, 1/H) router and w13, N(0, 1/I) w2, from `seed`; shared experts (the same
  // on every rank) as cuda::SharedExperts::random draws them.
  static CudaEpLayer synthetic(MoeConfig config, ExpertMap map, Communicator& host,
                               Communicator* device, CudaEpOptions options, uint64_t seed);
  ~CudaEpLayer();
  CudaEpLayer(CudaEpLayer&&) noexcept;
  CudaEpLayer& operator=(CudaEpLayer&&) noexcept;

  // hidden [M, H] bf16 on this rank's GPU (M may be 0) -> out [M, H] bf16 on the GPU. A
  // collective: every rank calls it once per step. Synchronizes and throws moe::Error when a
  // rank overflowed the low-latency capacity (on every rank, with the counts) or a peer did not
  // answer within the timeout.
  void forward(const TensorView& hidden, const TensorView& out);
  // The same on a routing the caller chose: topk_ids [M, k] int32 in [0, E) (or -1: no expert)
  // and topk_weights [M, k] f32, both on the GPU.
  void forward_routed(const TensorView& hidden, const TensorView& topk_ids,
                      const TensorView& topk_weights, const TensorView& out);

  // The stages of forward_routed one by one, queued on stream() (benchmarks, CUDA graphs). With
  // the low-latency path none synchronizes the host, so the three can be captured in a graph
  // once a step of the same M ran outside it; finish_step() then synchronizes and reports.
  // The high-throughput dispatch all-gathers the token counts on the host (and synchronizes for
  // the row counts over NCCL). combine also adds the shared experts, which read dispatch's hidden
  // again: it must stay in place until then, apart from out.
  void dispatch(const TensorView& hidden, const TensorView& topk_ids,
                const TensorView& topk_weights);
  void experts();
  void combine(const TensorView& out);
  void finish_step();  // waits for the stream; throws as forward does; fills last_stats()

  // Two-batch overlap (options().two_batch_overlap): the step's tokens split in two
  // micro-batches, rows [0, ceil(M/2)) and the rest, each with its own stream and buffers, so
  // one's dispatch and combine run while the other's experts compute:
  //   stream():   dispatch 0 | experts 0 |             | combine 0 | shared 0
  //   second:                | dispatch 1 | experts 1               | combine 1 | shared 1
  // Transfers keep the order dispatch 0, dispatch 1, combine 0, combine 1 and the experts run
  // one after the other (events between the streams), alike on every rank; each micro-batch's
  // shared experts (if any) follow its combine on its stream. The result equals
  // forward's within the same bf16 tolerance (each micro-batch is a step of its own; with
  // replicas the choice counts each micro-batch's pairs from 0).
  void forward_two_batch(const TensorView& hidden, const TensorView& out);
  void forward_routed_two_batch(const TensorView& hidden, const TensorView& topk_ids,
                                const TensorView& topk_weights, const TensorView& out);
  // The same step queued on stream() without the host synchronization of finish_step (the second
  // stream forks from stream() and joins it again): on the low-latency path it can be captured
  // in a CUDA graph once a two-batch step of the same M ran outside it; finish_step() then
  // reports both micro-batches.
  void two_batch_step(const TensorView& hidden, const TensorView& topk_ids,
                      const TensorView& topk_weights, const TensorView& out);

  // From the next step on, count the pairs each local slot serves (CudaEpStats::
  // pairs_per_local_slot): a small kernel over the received ids after the experts, inside their
  // time, so benchmarks count in an untimed step. Off at construction. Local to this rank: its
  // peers need not do the same.
  void count_served_pairs(bool on);

  void* stream() const;  // the cudaStream_t every stage runs on
  const MoeConfig& config() const { return config_; }
  const ExpertMap& expert_map() const;
  const CudaEpOptions& options() const { return options_; }
  const CudaEpStats& last_stats() const;

 private:
  struct State;
  CudaEpLayer(MoeConfig config, CudaEpOptions options, std::unique_ptr<State> state);
  std::pair<TensorView, TensorView> route(const TensorView& hidden);  // ids, weights
  MoeConfig config_;
  CudaEpOptions options_;
  std::unique_ptr<State> state_;
};

}  // namespace moe
