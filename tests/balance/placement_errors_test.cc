// Bad input to the trace placement functions: a moe::Error that names the argument, never a crash.
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/expect_error.h"

#include "moe/error.h"
#include "moe/placement.h"

namespace moe {
namespace {

using testing::error_message;
using testing::expect_error;

// A valid problem: 2 layers of 4 experts, top-2, 3 tokens, on 2 nodes of 2 GPUs.
struct Problem {
  RoutingTrace trace{
      .num_layers = 2,
      .num_experts = 4,
      .top_k = 2,
      .layers = {{{0, 1, 2, 3, 3, 0}, {0, 1, 3}, {}}, {{1, 2, 0, 3, 2, 1}, {2, 2, 0}, {}}}};
  ExpertPlacement placement = contiguous_placement(2, 4, 8, 4, 2);
  Topology topology{
      .num_nodes = 2, .gpus_per_node = 2, .intra_node_gbps = 150, .inter_node_gbps = 50};
  ActivationRow row{.hidden_size = 16, .bytes_per_value = 2};
  PlacementSearch search;

  void traffic() const { trace_traffic(trace, placement, topology, row); }
  void optimize() const { optimize_placement(trace, placement, topology, row, search); }
};

TEST(PlacementErrors, ValidProblemPasses) {
  const Problem p;
  EXPECT_NO_THROW(p.traffic());
  EXPECT_NO_THROW(p.optimize());
}

TEST(PlacementErrors, BadTraceIds) {
  Problem p;
  p.trace.layers[1].topk_ids[3] = 4;
  expect_error([&] { p.traffic(); },
               {"trace.layers[1].topk_ids", "[0, 4)", "got 4", "token 1, choice 1"});
  p.trace.layers[1].topk_ids[3] = -1;
  expect_error([&] { p.optimize(); }, {"trace.layers[1].topk_ids", "got -1"});
  p.trace.layers[1].topk_ids[3] = 0;
  expect_error([&] { p.traffic(); }, {"trace.layers[1].topk_ids", "distinct", "token 1"});
  Problem q;
  q.trace.layers[0].source_gpu[2] = 4;
  expect_error([&] { q.traffic(); }, {"trace.layers[0].source_gpu", "[0, 4)", "got 4", "token 2"});
}

TEST(PlacementErrors, BadTraceSizes) {
  Problem p;
  p.trace.layers[0].topk_ids.push_back(1);
  expect_error([&] { p.traffic(); }, {"trace.layers[0].topk_ids", "top_k = 2", "got 7"});
  Problem q;
  q.trace.layers[1].source_gpu.pop_back();
  expect_error([&] { q.traffic(); }, {"trace.layers[1].source_gpu", "one GPU per token (3)",
                                      "got 2", "assign_sources_round_robin"});
  Problem r;
  r.trace.layers.pop_back();
  expect_error([&] { r.traffic(); }, {"trace.layers", "2 layers", "got 1"});
  Problem s;
  s.trace.top_k = 5;
  expect_error([&] { s.traffic(); }, {"trace.top_k", "1..4", "got 5"});
  s.trace.top_k = 0;
  expect_error([&] { s.traffic(); }, {"trace.top_k", "got 0"});
  Problem t;
  t.trace.num_layers = 0;
  expect_error([&] { t.traffic(); }, {"trace.num_layers", "got 0"});
}

TEST(PlacementErrors, PlacementMustMatch) {
  Problem p;
  p.placement = contiguous_placement(2, 4, 6, 3, 1);
  p.topology.num_nodes = 1;
  p.topology.gpus_per_node = 4;
  expect_error([&] { p.traffic(); }, {"placement.num_gpus", "1 * 4 = 4", "got 3"});
  Problem q;
  q.placement = contiguous_placement(2, 4, 8, 4, 1);
  expect_error([&] { q.traffic(); }, {"placement.num_nodes", "topology.num_nodes = 2", "got 1"});
  Problem r;
  r.placement = contiguous_placement(3, 4, 8, 4, 2);
  expect_error([&] { r.traffic(); }, {"placement.num_layers", "= 2", "got 3"});
  Problem s;
  s.placement = contiguous_placement(2, 5, 8, 4, 2);
  expect_error([&] { s.traffic(); }, {"placement.num_logical_experts", "= 4", "got 5"});
  Problem t;
  t.placement.phy2log[3] = 9;
  expect_error([&] { t.optimize(); }, {"placement", "[0, 4)", "got 9"});
}

TEST(PlacementErrors, BadTopology) {
  Problem p;
  p.topology.inter_node_gbps = 0;
  expect_error([&] { p.traffic(); }, {"topology.inter_node_gbps", "> 0", "got 0"});
  p.topology.inter_node_gbps = std::nan("");
  expect_error([&] { p.traffic(); }, {"topology.inter_node_gbps", "finite", "nan"});
  Problem q;
  q.topology.intra_node_gbps = -5;
  expect_error([&] { q.traffic(); }, {"topology.intra_node_gbps", "got -5"});
  Problem r;
  r.topology.gpus_per_node = 0;
  expect_error([&] { r.traffic(); }, {"topology.gpus_per_node", "got 0"});
}

TEST(PlacementErrors, BadRowAndSearch) {
  Problem p;
  p.row.hidden_size = 0;
  expect_error([&] { p.traffic(); }, {"row.hidden_size", "got 0"});
  Problem q;
  q.row.hidden_size = std::numeric_limits<int64_t>::max() / 4;
  expect_error([&] { q.traffic(); }, {"row", "overflow"});
  Problem r;
  r.search.load_bound = 0.99;
  expect_error([&] { r.optimize(); }, {"search.load_bound", ">= 1", "got 0.99"});
  r.search.load_bound = std::numeric_limits<double>::infinity();
  expect_error([&] { r.optimize(); }, {"search.load_bound", "finite", "inf"});
  Problem s;
  s.search.max_sweeps = 0;
  expect_error([&] { s.optimize(); }, {"search.max_sweeps", "got 0"});
  s.search.max_sweeps = 1;
  s.search.max_rounds = -1;
  expect_error([&] { s.optimize(); }, {"search.max_rounds", "got -1"});
}

TEST(PlacementErrors, RoundRobinSources) {
  Problem p;
  expect_error([&] { assign_sources_round_robin(p.trace, 0); }, {"num_gpus", "got 0"});
  p.trace.layers[0].topk_ids.pop_back();
  expect_error([&] { assign_sources_round_robin(p.trace, 4); },
               {"trace.layers[0].topk_ids", "multiple of 2", "got 5"});
}

}  // namespace
}  // namespace moe
