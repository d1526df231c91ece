// The peer-to-peer data path: one IPC-mapped region per rank, laid out identically on every rank,
// written (and with the pull combine read) by peers directly (ep_kernels.h). The low-latency path
// (fixed capacity, capturable in a CUDA graph) and, on one host with every GPU reachable, the
// high-throughput path (the capacity grows collectively to the most tokens a rank has, so nothing
// overflows). Per rank, for N ranks, capacity C, H, k:
//
//   dispatch rows     bf16 [N, C, H]   block s: rows from source s
//   dispatch ids      int32 [N, C, k]  (the experts read rows, ids and weights in place)
//   dispatch weights  f32 [N, C, k]
//   combine rows      bf16 [N, C, H]   push: block d: partial rows returned by rank d
//                                      pull: block s: this rank's experts' partial rows for
//                                      source s, written by moe_sum, read by s in place
//   dispatch flags    u64 [N]          word s: {step, rows} from source s
//   combine flags     u64 [N]          word d: {step, rows | overflow bit} from rank d
//
// Buffer reuse without resets: a source writes step s + 1 into a peer only after that peer's
// combine of step s arrived, which the peer sends after its experts finished reading step s; and
// every rank waits for every peer's combine flag each step, tokens or not. With the pull combine a
// rank's experts rewrite their partial rows in step s + 1 only after every source's dispatch of
// s + 1, which each source queues after its reads of step s (docs/parallel-cuda.md).
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_buffer.h"
#include "parallel/cuda/data_path.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/cuda/ipc_buffers.h"
#include "parallel/cuda/step_scratch.h"

namespace moe::cuda::ep {
namespace {

constexpr size_t kAlign = 256;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct Layout {
  size_t rows = 0, ids = 0, weights = 0, combine_rows = 0, dispatch_flags = 0, combine_flags = 0;
  size_t bytes = 0;
};

Layout make_layout(int N, int64_t C, int64_t H, int64_t k) {
  Layout l;
  size_t offset = 0;
  const auto place = [&](size_t& at, size_t bytes) {
    at = offset;
    offset += aligned(bytes);
  };
  const size_t slots = static_cast<size_t>(N) * static_cast<size_t>(C);
  place(l.rows, slots * static_cast<size_t>(H) * 2);
  place(l.ids, slots * static_cast<size_t>(k) * sizeof(int32_t));
  place(l.weights, slots * static_cast<size_t>(k) * sizeof(float));
  place(l.combine_rows, slots * static_cast<size_t>(H) * 2);
  place(l.dispatch_flags, static_cast<size_t>(N) * sizeof(uint64_t));
  place(l.combine_flags, static_cast<size_t>(N) * sizeof(uint64_t));
  l.bytes = offset;
  return l;
}

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}

class LowLatencyPath : public DataPath {
 public:
  // grows: before each dispatch the ranks all-gather their token counts through `host` (no
  // device synchronization) and reallocate the buffers together when one has more than C.
  LowLatencyPath(Communicator& host, const PathShape& shape, int64_t capacity, uint64_t timeout_ns,
                 bool grows, bool pull_combine)
      : host_(host),
        shape_(shape),
        timeout_ns_(timeout_ns),
        grows_(grows),
        pull_combine_(pull_combine),
        scratch_(shape.num_ranks) {
    check_same_combine();
    allocate(capacity);
  }

  void dispatch(const TokensIn& in, cudaStream_t stream) override {
    ++host_steps_;
    if (grows_) fit(in.num_tokens, stream);
    const int N = shape_.num_ranks, me = shape_.rank;
    const int64_t C = capacity_, H = shape_.hidden_size, k = shape_.top_k;
    DispatchSendArgs send = dispatch_send_args(in, shape_, C, scratch_);
    for (int d = 0; d < N; ++d) {
      void* peer = buffers_->of_rank(d);
      send.dest_rows[d] = at<uint16_t>(peer, layout_.rows) + me * C * H;
      send.dest_ids[d] = at<int32_t>(peer, layout_.ids) + me * C * k;
      send.dest_weights[d] = at<float>(peer, layout_.weights) + me * C * k;
      send.dest_flags[d] = at<uint64_t>(peer, layout_.dispatch_flags) + me;
    }
    send.wait.flags = at<uint64_t>(local(), layout_.dispatch_flags);
    send.wait.ids = at<int32_t>(local(), layout_.ids);
    send.wait.timeout_ns = timeout_ns_;
    send.wait.received_counts = scratch_.received_counts();
    slot_of_ = send.slot_of;
    num_tokens_ = in.num_tokens;
    dispatch_send(send, stream);
  }

  ReceivedRows received() const override {
    ReceivedRows r;
    r.rows = at<uint16_t>(local(), layout_.rows);
    r.ids = at<int32_t>(local(), layout_.ids);
    r.weights = at<float>(local(), layout_.weights);
    r.num_rows = shape_.num_ranks * capacity_;
    // Pull: the experts write their partial rows where the sources read them.
    r.partial = pull_combine_ ? at<uint16_t>(local(), layout_.combine_rows) : partial_.data();
    return r;
  }

  void combine(void* out, cudaStream_t stream) override {
    if (pull_combine_) {
      combine_pull_rows(out, stream);
    } else {
      combine_push_rows(out, stream);
    }
  }

  Status read_status(cudaStream_t stream) const override { return scratch_.read_status(stream); }
  void clear_status(cudaStream_t stream) const override { scratch_.clear_status(stream); }
  std::vector<int64_t> rows_sent(cudaStream_t stream) const override {
    return scratch_.read_counts(scratch_.sent_counts(), stream);
  }
  std::vector<int64_t> rows_received(cudaStream_t stream) const override {
    return scratch_.read_counts(scratch_.received_counts(), stream);
  }

 private:
  void* local() const { return buffers_->of_rank(shape_.rank); }

  // Push: each partial row into its source's combine block, then the sum of what came back.
  void combine_push_rows(void* out, cudaStream_t stream) {
    const int N = shape_.num_ranks, me = shape_.rank;
    const int64_t C = capacity_, H = shape_.hidden_size;
    CombineSendArgs send;
    send.partial = partial_.data();
    send.received_counts = scratch_.received_counts();
    send.hidden_size = H;
    send.capacity = C;
    send.num_ranks = N;
    send.step = scratch_.step();
    for (int s = 0; s < N; ++s) {
      void* peer = buffers_->of_rank(s);
      send.dest_rows[s] = at<uint16_t>(peer, layout_.combine_rows) + me * C * H;
      send.dest_flags[s] = at<uint64_t>(peer, layout_.combine_flags) + me;
    }
    send.blocks_done = scratch_.combine_done();
    send.status = scratch_.status();
    combine_send(send, stream);

    CombineSumArgs sum;
    for (int d = 0; d < N; ++d)
      sum.rows[d] = at<uint16_t>(local(), layout_.combine_rows) + d * C * H;
    sum.slot_of = slot_of_;
    sum.num_tokens = num_tokens_;
    sum.hidden_size = H;
    sum.num_ranks = N;
    sum.out = out;
    sum.flags = at<uint64_t>(local(), layout_.combine_flags);
    sum.step = scratch_.step();
    sum.timeout_ns = timeout_ns_;
    sum.status = scratch_.status();
    combine_sum(sum, stream);
  }

  // Pull: a flag to each source, then the sum of every rank's partial rows read in place.
  void combine_pull_rows(void* out, cudaStream_t stream) {
    const int N = shape_.num_ranks, me = shape_.rank;
    const int64_t C = capacity_, H = shape_.hidden_size;
    CombinePublishArgs publish;
    publish.received_counts = scratch_.received_counts();
    publish.num_ranks = N;
    publish.step = scratch_.step();
    for (int s = 0; s < N; ++s) {
      publish.dest_flags[s] = at<uint64_t>(buffers_->of_rank(s), layout_.combine_flags) + me;
    }
    publish.status = scratch_.status();
    combine_publish(publish, stream);

    CombinePullArgs pull;
    for (int d = 0; d < N; ++d) {
      pull.rows[d] = at<uint16_t>(buffers_->of_rank(d), layout_.combine_rows) + me * C * H;
    }
    pull.slot_of = slot_of_;
    pull.num_tokens = num_tokens_;
    pull.hidden_size = H;
    pull.num_ranks = N;
    pull.out = out;
    pull.flags = at<uint64_t>(local(), layout_.combine_flags);
    pull.step = scratch_.step();
    pull.timeout_ns = timeout_ns_;
    pull.status = scratch_.status();
    combine_pull(pull, stream);
  }

  // A rank pushing partial rows into a rank that keeps its own there would corrupt them: every
  // rank must combine alike. Each rank sees every choice, so all fail together (a collective).
  void check_same_combine() {
    const int32_t mine = pull_combine_ ? 1 : 0;
    std::vector<int32_t> all(static_cast<size_t>(shape_.num_ranks));
    host_.all_gather(&mine, sizeof mine, all.data());
    for (int r = 0; r < shape_.num_ranks; ++r) {
      if (all[static_cast<size_t>(r)] != mine) {
        fail(
            "CudaEpLayer: rank {} combines by {} and rank {} by {}; every rank must choose alike "
            "(CudaEpOptions::combine, MOE_EP_COMBINE)",
            shape_.rank, mine != 0 ? "pull" : "push", r,
            all[static_cast<size_t>(r)] != 0 ? "pull" : "push");
      }
    }
  }

  // A collective: the old mapping goes on every rank (IpcBuffers' destructor waits for all)
  // before the new one is made. Flags of the new buffers are zero (step 0), which no step number
  // in use matches, and the step numbers go on.
  void allocate(int64_t capacity) {
    buffers_.reset();
    capacity_ = capacity;
    layout_ = make_layout(shape_.num_ranks, capacity, shape_.hidden_size, shape_.top_k);
    buffers_ = std::make_unique<IpcBuffers>(host_, layout_.bytes);
    if (pull_combine_) return;  // the partial rows live in the combine rows of the buffers
    const int64_t slots = shape_.num_ranks * capacity;
    partial_.reserve(static_cast<size_t>(std::max<int64_t>(slots * shape_.hidden_size, 1)) * 2);
  }

  // Every rank sees the same largest count, so all reallocate in the same step. The previous
  // step is complete on every rank by then: this rank's stream is drained here, and its
  // combine_sum waited for every peer's last write into its buffers. With the pull combine
  // peers may still read this rank's partial rows of that step, but IpcBuffers' destructor
  // frees the memory only after every rank drained its device and reached its barrier.
  void fit(int64_t num_tokens, cudaStream_t stream) {
    std::vector<int64_t> all(static_cast<size_t>(shape_.num_ranks));
    exchange_in_step(
        host_steps_, shape_.rank, "dispatch",
        fmt::format("the token counts' all-gather through the {} communicator", host_.name()),
        other_ranks(shape_.num_ranks, shape_.rank),
        [&] { host_.all_gather(&num_tokens, sizeof num_tokens, all.data()); });
    const int64_t most = *std::max_element(all.begin(), all.end());
    if (most <= capacity_) return;
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (growing the IPC buffers)");
    allocate(most);
  }

  Communicator& host_;
  PathShape shape_;
  int64_t capacity_ = 0;
  uint64_t timeout_ns_;
  bool grows_;
  bool pull_combine_;
  Layout layout_;
  std::unique_ptr<IpcBuffers> buffers_;
  mutable StepScratch scratch_;
  DeviceBuffer partial_;  // bf16 [N * C, H]; push only (pull: in the combine rows)
  int32_t* slot_of_ = nullptr;
  int64_t num_tokens_ = 0;
  // Steps dispatched from the host, for fit()'s errors: the device's step number on the growing
  // path, which no CUDA graph can capture (replays would advance only the device's).
  uint32_t host_steps_ = 0;
};

}  // namespace

std::unique_ptr<DataPath> make_low_latency_path(Communicator& host, const PathShape& shape,
                                                int64_t capacity, uint64_t timeout_ns,
                                                bool pull_combine) {
  return std::make_unique<LowLatencyPath>(host, shape, capacity, timeout_ns, false, pull_combine);
}

std::unique_ptr<DataPath> make_peer_high_throughput_path(Communicator& host, const PathShape& shape,
                                                         uint64_t timeout_ns, bool pull_combine) {
  // One row per (source, destination) until the first step says how many it needs.
  return std::make_unique<LowLatencyPath>(host, shape, 1, timeout_ns, true, pull_combine);
}

}  // namespace moe::cuda::ep
