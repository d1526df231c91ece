// Greedy replication. Splitting the expert with the largest load per replica is optimal for the
// quantity it targets: no other way to hand out the same number of replicas gives a smaller
// maximum of load / count (the argument of the D'Hondt apportionment method). A heap keeps each
// step at O(log num_experts), so wide redundancy (thousands of slots) stays cheap.
#include "balance/replicate.h"

#include <queue>
#include <utility>
#include <vector>

namespace moe::balance {
namespace {

struct Candidate {
  double load_per_replica;
  int32_t expert;
};

// Orders the heap so that its top is the largest load per replica, then the lowest expert id:
// the element torch.max returns first, which the reference relies on.
struct ComesLater {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.load_per_replica != b.load_per_replica) return a.load_per_replica < b.load_per_replica;
    return a.expert > b.expert;
  }
};

}  // namespace

void replicate_experts(std::span<const double> load, std::span<int32_t> replica_expert,
                       std::span<int32_t> replica_rank, std::span<int32_t> count) {
  const size_t num_experts = load.size();
  std::vector<Candidate> candidates(num_experts);
  for (size_t e = 0; e < num_experts; ++e) {
    replica_expert[e] = static_cast<int32_t>(e);
    replica_rank[e] = 0;
    count[e] = 1;
    candidates[e] = {load[e], static_cast<int32_t>(e)};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, ComesLater> heap(ComesLater{},
                                                                          std::move(candidates));
  for (size_t r = num_experts; r < replica_expert.size(); ++r) {
    const int32_t expert = heap.top().expert;
    heap.pop();
    replica_expert[r] = expert;
    replica_rank[r] = count[expert];
    ++count[expert];
    heap.push({load[expert] / count[expert], expert});
  }
}

}  // namespace moe::balance
