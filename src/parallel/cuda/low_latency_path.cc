// The peer-to-peer data path: one IPC-mapped region per rank, laid out identically on every rank,
// written (dispatch) and read (combine) by peers directly (ep_kernels.h). The low-latency path
// (fixed capacity, capturable in a CUDA graph) and, on one host with every GPU reachable, the
// high-throughput path (the capacity grows collectively to the most tokens a rank has, so nothing
// overflows). Per rank, for N ranks, capacity C, H, k:
//
//   dispatch rows     bf16 [N, C, H]   block s: rows from source s
//   dispatch ids      int32 [N, C, k]  (the experts read rows, ids and weights in place)
//   dispatch weights  f32 [N, C, k]
//   combine rows      bf16 [N, C, H]   block s: this rank's experts' partial rows for source
//                                      s, written by moe_sum, read by s in place
//   dispatch flags    u64 [N]          word s: {step, rows} from source s
//   combine flags     u64 [N]          word d: {step, rows | overflow bit} from rank d
//
// Buffer reuse without resets: a source writes step s + 1 into a peer only after that peer's
// combine flag of step s arrived, which the peer publishes after its experts finished reading
// step s; and every rank waits for every peer's combine flag each step, tokens or not. A rank's
// experts rewrite their partial rows in step s + 1 only after every source's dispatch of s + 1,
// which each source queues after its reads of step s (the NOTE in ep_combine.cu).
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "kernels/cuda/check.h"
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
                 bool grows)
      : host_(host),
        shape_(shape),
        timeout_ns_(timeout_ns),
        grows_(grows),
        scratch_(shape.num_ranks) {
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
    // The experts write their partial rows where the sources read them.
    r.partial = at<uint16_t>(local(), layout_.combine_rows);
    return r;
  }

  // A flag to each source (raised by combine_sum), then the sum of every rank's partial rows for
  // this rank's tokens, read in place.
  void combine(void* out, cudaStream_t stream) override {
    const int N = shape_.num_ranks, me = shape_.rank;
    const int64_t C = capacity_, H = shape_.hidden_size;

    CombineSumArgs sum;
    for (int d = 0; d < N; ++d) {
      sum.rows[d] = at<uint16_t>(buffers_->of_rank(d), layout_.combine_rows) + me * C * H;
    }
    sum.slot_of = slot_of_;
    sum.num_tokens = num_tokens_;
    sum.hidden_size = H;
    sum.num_ranks = N;
    sum.out = out;
    sum.flags = at<uint64_t>(local(), layout_.combine_flags);
    sum.step = scratch_.step();
    sum.timeout_ns = timeout_ns_;
    sum.status = scratch_.status();
    for (int s = 0; s < N; ++s) {
      sum.publish.dest_flags[s] = at<uint64_t>(buffers_->of_rank(s), layout_.combine_flags) + me;
    }
    sum.publish.received_counts = scratch_.received_counts();
    sum.publish.published_step = scratch_.combine_published();
    combine_sum(sum, stream);
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

  // A collective: the old mapping goes on every rank (IpcBuffers' destructor waits for all)
  // before the new one is made. Flags of the new buffers are zero (step 0), which no step number
  // in use matches, and the step numbers go on.
  void allocate(int64_t capacity) {
    buffers_.reset();
    capacity_ = capacity;
    layout_ = make_layout(shape_.num_ranks, capacity, shape_.hidden_size, shape_.top_k);
    buffers_ = std::make_unique<IpcBuffers>(host_, layout_.bytes);
  }

  // Every rank sees the same largest count, so all reallocate in the same step. The previous
  // step is complete on this rank by then: its stream is drained here, and its combine_sum
  // waited for every peer's last write into its buffers (the flags). Peers may still read this
  // rank's partial rows of that step, but IpcBuffers' destructor frees the memory only after
  // every rank drained its device and reached its barrier.
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
  Layout layout_;
  std::unique_ptr<IpcBuffers> buffers_;
  mutable StepScratch scratch_;
  int32_t* slot_of_ = nullptr;
  int64_t num_tokens_ = 0;
  // Steps dispatched from the host, for fit()'s errors: the device's step number on the growing
  // path, which no CUDA graph can capture (replays would advance only the device's).
  uint32_t host_steps_ = 0;
};

}  // namespace

std::unique_ptr<DataPath> make_low_latency_path(Communicator& host, const PathShape& shape,
                                                int64_t capacity, uint64_t timeout_ns) {
  return std::make_unique<LowLatencyPath>(host, shape, capacity, timeout_ns, false);
}

std::unique_ptr<DataPath> make_peer_high_throughput_path(Communicator& host, const PathShape& shape,
                                                         uint64_t timeout_ns) {
  // One row per (source, destination) until the first step says how many it needs.
  return std::make_unique<LowLatencyPath>(host, shape, 1, timeout_ns, true);
}

}  // namespace moe::cuda::ep
