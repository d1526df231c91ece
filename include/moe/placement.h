// Expert placement from routing traces and the network topology: how many activation bytes a
// placement makes dispatch and combine send over each link domain, and a local search that swaps
// experts between GPUs so that frequent traffic stays on fast links while every GPU's load stays
// within a bound.
//
// Traffic model, per layer (token t picks k experts; pair p = t*k + j):
//   replica    an expert with c replicas serves its n pairs evenly: its replicas, in slot order,
//              get n / c pairs each and the first n % c get one more. Pairs take replicas in three
//              passes, each in pair order: first a replica with room on the token's own GPU (the
//              lowest slot), then one on the token's node, then the lowest slot with room.
//   dispatch   the token's hidden row (H * bytes_per_value bytes) goes once to each distinct GPU
//              that serves one of its pairs, however many of its pairs that GPU serves (DeepEP's
//              convention). A row to the token's own GPU crosses no link: it is counted as
//              same-GPU bytes, which cost nothing.
//   combine    the same rows come back: the same bytes per domain in the other direction.
//   load       a GPU's load is the number of pairs its slots serve.
//   time       bandwidths are per GPU and per direction. A domain takes the largest number of
//              bytes any GPU sends or receives in it over that domain's bandwidth; the same-node
//              and cross-node domains run at once, so dispatch takes the slower of the two.
//              Combine takes as long again.
// Everything is deterministic: the same input gives the same output on every machine.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/eplb.h"

namespace moe {

// Nodes of equal size; GPU g lives on node g / gpus_per_node, as in ExpertPlacement.
struct Topology {
  int64_t num_nodes = 1;
  int64_t gpus_per_node = 1;
  double intra_node_gbps = 0;  // one GPU's same-node bandwidth per direction (NVLink), 1e9 B/s
  double inter_node_gbps = 0;  // one GPU's cross-node bandwidth per direction (RDMA NIC), 1e9 B/s

  int64_t num_gpus() const { return num_nodes * gpus_per_node; }
};

// One layer of a routing trace. Layers may hold different numbers of tokens.
struct TraceLayer {
  std::vector<int32_t> topk_ids;    // [num_tokens, top_k]: distinct expert ids per token
  std::vector<int32_t> source_gpu;  // [num_tokens]: the data-parallel rank that holds the token
  // [num_steps + 1]: token offsets of each serving step (trace files); empty = one step.
  std::vector<int64_t> step_offsets;
};

// Which experts the tokens of a run picked, layer by layer (in memory; files come later).
struct RoutingTrace {
  int64_t num_layers = 0;
  int64_t num_experts = 0;  // logical experts
  int64_t top_k = 0;
  std::vector<TraceLayer> layers;  // [num_layers]
};

// For a trace that does not say where its tokens lived: token t of every layer is held by GPU
// t % num_gpus. Throws moe::Error unless top_k >= 1, num_gpus >= 1 and every layer's topk_ids
// holds whole tokens.
void assign_sources_round_robin(RoutingTrace& trace, int64_t num_gpus);

// The row that dispatch sends per token and destination GPU.
struct ActivationRow {
  int64_t hidden_size = 0;      // H
  int64_t bytes_per_value = 2;  // 2 for bf16 rows, 1 for fp8 dispatch

  int64_t bytes() const { return hidden_size * bytes_per_value; }
};

// Dispatch bytes by where the row goes; combine sends the same bytes back.
struct DomainBytes {
  int64_t same_gpu = 0;    // the expert's GPU holds the token: no link
  int64_t same_node = 0;   // another GPU of the token's node
  int64_t cross_node = 0;  // a GPU of another node
};

struct LayerTraffic {
  DomainBytes dispatch;
  int64_t upper_bound_bytes = 0;  // T * k * H * b: a row per pair, before locality and dedup
  double same_node_seconds = 0;   // the busiest GPU's same-node bytes / intra_node bandwidth
  double cross_node_seconds = 0;  // the busiest GPU's cross-node bytes / inter_node bandwidth
  double dispatch_seconds = 0;    // the larger of the two; combine takes as long
  int64_t max_gpu_load = 0;       // pairs
  double mean_gpu_load = 0;       // pairs

  double skew() const { return mean_gpu_load > 0 ? max_gpu_load / mean_gpu_load : 1.0; }
};

struct TrafficReport {
  int64_t num_layers = 0;
  int64_t num_gpus = 0;
  std::vector<LayerTraffic> layers;  // [num_layers]
  std::vector<int64_t> gpu_load;     // [num_layers, num_gpus]: pairs each GPU serves
  DomainBytes dispatch;              // summed over layers
  int64_t upper_bound_bytes = 0;     // summed over layers
  double dispatch_seconds = 0;       // summed over layers (they run one after the other)
  double max_skew = 1.0;             // the worst layer's max / mean GPU load

  double dispatch_combine_seconds() const { return 2 * dispatch_seconds; }
};

// The traffic and load of `trace` under `placement`. Throws moe::Error naming the argument unless
// the placement is consistent and matches the trace (layers, experts) and the topology (GPUs,
// nodes), every id and source GPU is in range, and the row size is >= 1 byte.
TrafficReport trace_traffic(const RoutingTrace& trace, const ExpertPlacement& placement,
                            const Topology& topology, const ActivationRow& row);

struct PlacementSearch {
  // Every GPU's load must stay <= load_bound * the layer's mean GPU load. A GPU above it in the
  // start may stay there but never grows, so a feasible start stays feasible and the largest
  // load never rises.
  double load_bound = 1.10;
  int64_t max_sweeps = 32;  // passes over the slots per layer and round
  // Searches per layer, each after the replicas are chosen again. Only layers with replicas use
  // more than one; at DeepSeek-V3 sizes a second round saves about 3% more cross-node bytes and
  // further ones under 1% each, for about the time of the first.
  int64_t max_rounds = 2;
};

struct PlacementResult {
  ExpertPlacement placement;  // the same replica counts and slots per GPU as the start
  TrafficReport before;
  TrafficReport after;
  int64_t num_swaps = 0;  // slot swaps kept, over all layers
};

// Swaps the experts of two slots on different GPUs while a swap lowers the layer's cross-node
// bytes (or keeps them and lowers the same-node bytes) and keeps the load bound; layers are
// independent. Per layer, the search fixes which slot serves each pair (the replica rule above),
// swaps whole slots with their pairs, and keeps the result only if the exact model agrees that
// it is better and within the bound; with replicas it then chooses the replicas again and repeats.
// So no layer ever ends with more cross-node bytes than it started with, nor with more same-node
// bytes at equal cross-node bytes. Validation as trace_traffic, plus load_bound finite and >= 1
// and max_sweeps, max_rounds >= 1, and at most 2^28 pairs in a layer.
PlacementResult optimize_placement(const RoutingTrace& trace, const ExpertPlacement& start,
                                   const Topology& topology, const ActivationRow& row,
                                   const PlacementSearch& search = {});

}  // namespace moe
