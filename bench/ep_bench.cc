// Dispatch + combine of the expert-parallel layer, alone (no expert compute), under mpirun:
// Qwen3-30B-A3B and DeepSeek-V3 shapes, 128 tokens per rank (decode) and 4096 (prefill), both
// dispatchers, bf16 hidden states, uniform routing over contiguous experts.
//
// Each figure is the slowest rank's median time of dispatch + combine and the bytes rank 0 sent
// to the other ranks (rows, records and counts, then bf16 results, as a bf16 layer's experts
// return them) over that time. Two floors are measured in the same run: the same bytes per peer
// through one plain all-to-all of the same communicator (what a perfect dispatcher would still pay
// on this transport), and every rank's bytes read once and written once at the memcpy bandwidth of
// one rank alone (the memory floor of any copy between processes of one host). Each is printed as
// floor time / our time.
//
// Run: mpirun -np 2 build/release/bench/moe_bench_ep [--tokens 128,4096] [--iterations 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "moe/config.h"
#include "moe/ep_layer.h"
#include "moe/error.h"
#include "moe/mpi_communicator.h"
#include "parallel/dispatcher.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Bytes per second of a 256 MiB memcpy (read + write), best of five.
double memcpy_bandwidth() {
  const size_t size = size_t{256} << 20;
  std::vector<char> src(size, 1), dst(size, 0);
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    const auto start = Clock::now();
    std::memcpy(dst.data(), src.data(), size);
    best = std::max(best, 2.0 * static_cast<double>(size) / seconds_since(start));
  }
  return best;
}

// The slowest rank's value.
double slowest(Communicator& comm, double mine) {
  std::vector<double> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, sizeof mine, all.data());
  return *std::max_element(all.begin(), all.end());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Shape {
  std::string model;
  int64_t hidden, experts, top_k;
};

struct Result {
  double seconds = 0;      // slowest rank's median dispatch + combine
  double bytes_out = 0;    // this rank's bytes to other ranks per step
  double total_bytes = 0;  // every rank's bytes to other ranks per step
  double raw_seconds = 0;  // the same bytes per peer through one plain all-to-all
};

Result measure(Communicator& comm, const Shape& shape, int64_t tokens, DispatcherKind kind,
               int iterations) {
  const int N = comm.size(), me = comm.rank();
  const int64_t H = shape.hidden, k = shape.top_k;
  const ExpertMap map = ExpertMap::contiguous(shape.experts, N);
  std::mt19937_64 rng(1000 + static_cast<uint64_t>(me));
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  std::vector<float> weights(ids.size(), 1.0f / static_cast<float>(k));
  std::vector<int32_t> experts(static_cast<size_t>(shape.experts));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), rng);
    std::copy(experts.begin(), experts.begin() + k, ids.begin() + t * k);
  }
  std::vector<uint16_t> hidden(static_cast<size_t>(tokens * H), 0x3f80);  // bf16 1.0
  std::unique_ptr<parallel::Dispatcher> dispatcher =
      parallel::make_dispatcher(kind, comm, map, H, k, tokens, 1);
  parallel::DispatchInput in;
  in.hidden = hidden.data();
  in.dtype = DType::kBF16;
  in.topk_ids = ids.data();
  in.topk_weights = weights.data();
  in.num_tokens = tokens;
  std::vector<uint16_t> results;  // bf16, as a bf16 layer's experts return them

  std::vector<double> times;
  EpStepStats stats;
  for (int i = 0; i < iterations + 2; ++i) {  // two warm-up steps size every buffer
    stats = EpStepStats{};
    for (auto* v : {&stats.dispatch_bytes_sent, &stats.dispatch_bytes_received,
                    &stats.combine_bytes_sent, &stats.combine_bytes_received}) {
      v->assign(static_cast<size_t>(N), 0);
    }
    stats.pairs_per_local_slot.assign(map.local_slots(me).size(), 0);
    comm.barrier();
    const auto start = Clock::now();
    dispatcher->start_dispatch(in, stats);
    const parallel::ReceivedPairs received = dispatcher->finish_dispatch(stats);
    if (static_cast<int64_t>(results.size()) < received.num_pairs * H) {
      results.resize(static_cast<size_t>(received.num_pairs * H));
    }
    dispatcher->start_combine(results.data(), DType::kBF16, stats);
    dispatcher->finish_combine(stats);
    if (i >= 2) times.push_back(seconds_since(start));
  }
  Result r;
  r.seconds = slowest(comm, median(times));
  std::vector<int64_t> per_peer(static_cast<size_t>(N));
  for (int p = 0; p < N; ++p) {
    per_peer[p] = p == me ? 0 : stats.dispatch_bytes_sent[p] + stats.combine_bytes_sent[p];
    r.bytes_out += static_cast<double>(per_peer[p]);
  }
  std::vector<double> all_out(static_cast<size_t>(N));
  comm.all_gather(&r.bytes_out, sizeof(double), all_out.data());
  for (double b : all_out) r.total_bytes += b;

  // The same bytes to each peer through one all-to-all: the communicator's own floor.
  std::vector<int64_t> recv_counts(static_cast<size_t>(N));
  const std::vector<int64_t> ones(static_cast<size_t>(N), sizeof(int64_t));
  std::vector<int64_t> by_rank(static_cast<size_t>(N));
  for (int p = 0; p < N; ++p) by_rank[p] = p * static_cast<int64_t>(sizeof(int64_t));
  comm.all_to_all_v(per_peer.data(), {ones, by_rank}, recv_counts.data(), {ones, by_rank});
  std::vector<int64_t> send_displs(static_cast<size_t>(N)), recv_displs(static_cast<size_t>(N));
  int64_t send_total = 0, recv_total = 0;
  for (int p = 0; p < N; ++p) {
    send_displs[p] = send_total;
    recv_displs[p] = recv_total;
    send_total += per_peer[p];
    recv_total += recv_counts[p];
  }
  std::vector<char> send(static_cast<size_t>(send_total), 1), recv(static_cast<size_t>(recv_total));
  std::vector<double> raw;
  for (int i = 0; i < iterations + 1; ++i) {
    comm.barrier();
    const auto start = Clock::now();
    comm.all_to_all_v(send.data(), {per_peer, send_displs}, recv.data(),
                      {recv_counts, recv_displs});
    if (i >= 1) raw.push_back(seconds_since(start));
  }
  r.raw_seconds = slowest(comm, median(raw));
  return r;
}

int run(MpiSession& session, int argc, char** argv) {
  std::vector<int64_t> token_counts = {128, 4096};
  int iterations = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--iterations") {
      iterations = std::atoi(argv[i + 1]);
    } else if (flag == "--tokens") {
      token_counts.clear();
      for (char* p = argv[i + 1]; *p;) {
        token_counts.push_back(std::strtoll(p, &p, 10));
        if (*p == ',') ++p;
      }
    } else {
      fail("moe_bench_ep: unknown option {}", flag);
    }
  }
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  comm->set_timeout(std::chrono::minutes(5));
  const bool root = comm->rank() == 0;
  const double copy = root ? memcpy_bandwidth() : 0;
  if (root) {
    fmt::print(
        "moe_bench_ep: {} ranks ({}), bf16 rows, bf16 results; memcpy {:.1f} GB/s (read + "
        "write, one rank alone)\n\n",
        comm->size(), comm->name(), copy * 1e-9);
    fmt::print("{:<15} {:>6} {:>4} | {:>10} {:>9} {:>7} | {:>9} {:>7} | {:>6} {:>7}\n", "model",
               "tokens", "disp", "MB to peers", "ms", "GB/s", "a2a ms", "GB/s", "vs a2a",
               "vs copy");
  }
  const std::vector<Shape> shapes = {{"qwen3-30b-a3b", 2048, 128, 8},
                                     {"deepseek-v3", 7168, 256, 8}};
  for (const Shape& shape : shapes) {
    for (int64_t tokens : token_counts) {
      for (DispatcherKind kind : {DispatcherKind::kHighThroughput, DispatcherKind::kLowLatency}) {
        const Result r = measure(*comm, shape, tokens, kind, iterations);
        const double gbps = r.bytes_out / r.seconds * 1e-9;
        const double raw_gbps = r.bytes_out / r.raw_seconds * 1e-9;
        if (!root) continue;
        const double copy_floor = 2 * r.total_bytes / copy;  // read once, written once
        fmt::print(
            "{:<15} {:>6} {:>4} | {:>10.2f} {:>9.3f} {:>7.2f} | {:>9.3f} {:>7.2f} | {:>5.0f}% "
            "{:>6.0f}%\n",
            shape.model, tokens, dispatcher_name(kind), r.bytes_out * 1e-6, r.seconds * 1e3, gbps,
            r.raw_seconds * 1e3, raw_gbps, 100 * r.raw_seconds / r.seconds,
            100 * copy_floor / r.seconds);
      }
    }
  }
  if (root) {
    fmt::print(
        "\nGB/s: rank 0's bytes to other ranks per step over the slowest rank's median "
        "time. vs a2a: the plain all-to-all's time over ours; vs copy: every rank's bytes "
        "read and written once at memcpy speed, over ours (100% = at the floor)\n");
  }
  return 0;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) {
  moe::MpiSession session(&argc, &argv);
  try {
    return moe::run(session, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_bench_ep: rank %d: %s\n", session.world_rank(), e.what());
    session.abort(1);
  }
}
