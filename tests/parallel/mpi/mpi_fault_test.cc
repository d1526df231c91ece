// Fault injection under mpirun: one rank (the victim) dies or stalls in the middle of an
// expert-parallel step, and every other rank must fail that step with a moe::Error naming the
// victim within the communicator's timeout. tests/parallel/mpi/run_fault_test.sh runs it and
// counts the survivors' verdicts.
//
//   moe_mpi_fault_test exit|stall|truncate VICTIM TIMEOUT_MS
//
// exit: the victim ends its process (no MPI_Finalize) at its 6th communicator operation, in the
// middle of the second step (after its count exchange, before its records and rows). stall: it
// sleeps there instead, alive but silent. truncate: every rank takes part, but the victim sends
// rank 0 more bytes than rank 0's bound: rank 0 alone must fail, naming the victim.
//
// Each survivor prints "rank R: PASS ..." or "rank R: FAIL ...". A failed step leaves a
// communicator that cannot be trusted, so survivors then wait a moment (for the others to print)
// and end the job with MPI_Abort, as the moe command line does.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "moe/ep_layer.h"
#include "moe/error.h"
#include "moe/mpi_communicator.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

// Forwards every operation to `inner`, except that the victim's `trigger`-th operation first
// kills or stalls its process.
class FaultyCommunicator : public Communicator {
 public:
  FaultyCommunicator(Communicator& inner, bool victim, int trigger, const std::string& mode)
      : Communicator(inner.rank(), hosts_of(inner)),
        inner_(inner),
        victim_(victim),
        trigger_(trigger),
        mode_(mode) {}
  Device device() const override { return inner_.device(); }
  std::string name() const override { return inner_.name(); }

 protected:
  std::unique_ptr<CommRequest> start(const void* send, PeerSplits send_splits, void* recv,
                                     PeerSplits recv_splits, std::span<int64_t> received) override {
    if (victim_ && ++operations_ == trigger_) {
      std::fprintf(stderr, "rank %d: victim: %s now\n", rank(), mode_.c_str());
      if (mode_ == "exit") std::_Exit(3);
      std::this_thread::sleep_for(std::chrono::minutes(5));
    }
    if (received.empty()) return inner_.start_all_to_all_v(send, send_splits, recv, recv_splits);
    return inner_.start_all_to_all_bounded(send, send_splits, recv, recv_splits, received);
  }

 private:
  static std::vector<int> hosts_of(const Communicator& c) {
    std::vector<int> hosts;
    for (int r = 0; r < c.size(); ++r) hosts.push_back(c.host_of(r));
    return hosts;
  }

  Communicator& inner_;
  bool victim_;
  int trigger_;
  std::string mode_;
  int operations_ = 0;
};

MoeConfig small_config() {
  MoeConfig c = preset_config("qwen3-30b-a3b");
  c.experts.hidden_size = 64;
  c.experts.intermediate_size = 32;
  c.routing.num_experts = 16;
  c.routing.top_k = 4;
  return c;
}

// Two steps of an expert-parallel layer (high-throughput: counts, records, rows, combine per
// step), so the 6th operation is the second step's records.
void two_steps(Communicator& comm) {
  const MoeConfig config = small_config();
  const ExpertMap map = ExpertMap::contiguous(config.routing.num_experts, comm.size());
  const std::vector<int32_t> experts = map.local_experts(comm.rank());
  EpOptions options;
  options.num_threads = 1;
  EpMoeLayer layer(config, synthetic_layer_weights(config, DType::kF32, 1, experts), map, comm,
                   options);
  Tensor hidden = Tensor::zeros(DType::kF32, {8, config.experts.hidden_size});
  for (int64_t i = 0; i < hidden.numel(); ++i) hidden.data<float>()[i] = 0.01f * (i % 97);
  for (int step = 0; step < 2; ++step) layer.forward(hidden);
}

// Rank 0 bounds what it takes from the victim at 4 bytes; the victim sends 8.
void truncated_exchange(Communicator& comm, int victim) {
  const int N = comm.size();
  std::vector<int64_t> send_counts(N, 0), bounds(N, 16), zeros(N, 0), received(N);
  if (comm.rank() == victim) send_counts[0] = 8;
  if (comm.rank() == 0) bounds[victim] = 4;
  std::vector<char> send(8, 'x'), recv(16);
  comm.start_all_to_all_bounded(send.data(), {send_counts, zeros}, recv.data(), {bounds, zeros},
                                received)
      ->wait();
}

int run(MpiSession& session, const std::string& mode, int victim, int timeout_ms) {
  const int me = session.world_rank();
  std::unique_ptr<Communicator> world = make_mpi_communicator();
  world->set_timeout(std::chrono::milliseconds(timeout_ms));
  FaultyCommunicator comm(*world, me == victim, mode == "truncate" ? 0 : 6, mode);
  const auto start = Clock::now();
  std::string error;
  try {
    if (mode == "truncate") {
      truncated_exchange(comm, victim);
    } else {
      two_steps(comm);
    }
  } catch (const Error& e) {
    error = e.what();
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  const bool should_fail = mode == "truncate" ? me == 0 : me != victim;
  const std::string victim_text = mode == "truncate" ? "receive from rank " + std::to_string(victim)
                                                     : "[" + std::to_string(victim) + "]";
  const bool named = error.find(victim_text) != std::string::npos;
  // The deadline runs from the start of the operation the victim never finishes, so the whole
  // call may take the first step's time on top of the timeout.
  const bool in_time = ms < timeout_ms + 5000;
  const bool pass = should_fail ? !error.empty() && named && in_time : error.empty();
  std::printf("rank %d: %s after %.0f ms (timeout %d ms): %s\n", me, pass ? "PASS" : "FAIL", ms,
              timeout_ms, error.empty() ? "no error" : error.c_str());
  std::fflush(stdout);
  if (mode == "truncate") {
    // Nobody is stuck: every rank can still meet to end cleanly.
    return pass ? 0 : 1;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  session.abort(pass ? 0 : 1);
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::MpiSession session(&argc, &argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s exit|stall|truncate VICTIM TIMEOUT_MS\n", argv[0]);
    return 2;
  }
  try {
    return moe::run(session, argv[1], std::atoi(argv[2]), std::atoi(argv[3]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", session.world_rank(), e.what());
    session.abort(1);
  }
}
