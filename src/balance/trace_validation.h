// Argument checks of include/moe/placement.h. Each throws moe::Error naming the argument, what
// was expected and what was given; past them the traffic model and the search trust their
// inputs. Trace ids index every table of the model, so these checks stay on in release builds.
#pragma once

#include "moe/placement.h"

namespace moe::balance {

// Counts >= 1 and bandwidths finite and > 0.
void check_topology(const Topology& topology);

// Sizes >= 1, top_k <= num_experts, one entry per layer, whole tokens in topk_ids, one source
// per token; ids in [0, num_experts) and distinct within a token; sources in [0, num_gpus).
void check_trace(const RoutingTrace& trace, int64_t num_gpus);

// Everything trace_traffic needs: the three above, a consistent placement with the trace's layers
// and experts and the topology's GPUs and nodes, and a row size whose byte totals fit in int64.
void check_traffic_inputs(const RoutingTrace& trace, const ExpertPlacement& placement,
                          const Topology& topology, const ActivationRow& row);

// load_bound finite and >= 1, max_sweeps and max_rounds >= 1, and no layer of the (checked)
// trace larger than the search handles.
void check_search(const PlacementSearch& search, const RoutingTrace& trace);

}  // namespace moe::balance
