// The high-throughput data path (prefill): dispatch_send packs each token row once per serving
// rank, into local staging blocks [N, M, H] (with ids and weights) for other ranks and straight
// into the front of the receive buffers for this rank; the row counts go through the host
// communicator, then rows, ids and weights travel in three exact all-to-alls of the device
// communicator (NCCL), dense by source on the receiver so the experts read them in place. The
// experts' partial rows for other ranks go back by one more all-to-all into [N, M, H] blocks, and
// combine_sum adds them to the own ones where the experts left them.
//
// Expert-grouped order on the wire is not needed: align_block_size groups the received pairs by
// expert on the receiver without copying a row, so rows travel in the order they were packed.
//
// Every wait here is a communicator's, bounded by its timeout (the NCCL one aborts the NCCL
// communicator when it passes); a failure is rethrown naming the step, the stage and the peers of
// the exchange (exchange_in_step), since NCCL cannot say which peer of a group is missing.
#include <fmt/format.h>

#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_buffer.h"
#include "moe/error.h"
#include "parallel/cuda/data_path.h"
#include "parallel/cuda/ep_kernels.h"
#include "parallel/cuda/step_scratch.h"

namespace moe::cuda::ep {
namespace {

// Per-peer byte counts and offsets for the communicator, from row counts and row offsets.
struct Splits {
  std::vector<int64_t> counts, displs;
  PeerSplits view() const { return {counts, displs}; }
};

Splits splits(const std::vector<int64_t>& rows, const std::vector<int64_t>& first_row,
              int64_t row_bytes) {
  Splits s;
  for (size_t p = 0; p < rows.size(); ++p) {
    s.counts.push_back(rows[p] * row_bytes);
    s.displs.push_back(first_row[p] * row_bytes);
  }
  return s;
}

template <typename T>
T* grown(DeviceBuffer& buffer, int64_t count) {
  buffer.reserve(static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T));
  return static_cast<T*>(buffer.data());
}

// Grows `buffer` to hold `bytes`, keeping its first `keep` bytes (the rank's own rows, written
// before the received rows' size was known).
void grow_keeping(DeviceBuffer& buffer, size_t bytes, size_t keep, cudaStream_t stream) {
  if (bytes <= buffer.capacity()) return;
  DeviceBuffer bigger;
  bigger.reserve(bytes);
  if (keep > 0) {
    check(cudaMemcpyAsync(bigger.data(), buffer.data(), keep, cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync (own rows)");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  buffer = std::move(bigger);
}

class HighThroughputPath : public DataPath {
 public:
  HighThroughputPath(Communicator& host, Communicator& device, const PathShape& shape)
      : host_(host), device_(device), shape_(shape), scratch_(shape.num_ranks) {
    if (device.device() != Device::kCuda) {
      fail(
          "high-throughput GPU path: the device communicator must move device buffers (NCCL); "
          "got '{}'",
          device.name());
    }
    if (device.size() != shape.num_ranks || device.rank() != shape.rank) {
      fail(
          "high-throughput GPU path: the device communicator is rank {} of {}, the host one "
          "rank {} of {}",
          device.rank(), device.size(), shape.rank, shape.num_ranks);
    }
  }

  // The rank's own rows are packed straight into the front of the receive buffers, where the
  // experts read them; only other ranks' rows are staged and sent.
  void dispatch(const TokensIn& in, cudaStream_t stream) override {
    const int N = shape_.num_ranks, me = shape_.rank;
    const int64_t H = shape_.hidden_size, k = shape_.top_k;
    // Each block holds every token: a rank never sends one peer more rows than that.
    const int64_t block_rows = std::max<int64_t>(in.num_tokens, 1);
    block_rows_ = block_rows;
    uint16_t* rows = grown<uint16_t>(send_rows_, N * block_rows * H);
    int32_t* ids = grown<int32_t>(send_ids_, N * block_rows * k);
    float* weights = grown<float>(send_weights_, N * block_rows * k);
    grown<uint16_t>(recv_rows_, block_rows * H);
    grown<int32_t>(recv_ids_, block_rows * k);
    grown<float>(recv_weights_, block_rows * k);

    DispatchSendArgs send = dispatch_send_args(in, shape_, block_rows, scratch_);
    for (int d = 0; d < N; ++d) {
      const bool own = d == me;
      send.dest_rows[d] = own ? recv_rows_.data() : rows + d * block_rows * H;
      send.dest_ids[d] = own ? static_cast<int32_t*>(recv_ids_.data()) : ids + d * block_rows * k;
      send.dest_weights[d] =
          own ? static_cast<float*>(recv_weights_.data()) : weights + d * block_rows * k;
    }
    slot_of_ = send.slot_of;
    num_tokens_ = in.num_tokens;
    ++step_;
    dispatch_send(send, stream);

    sent_ = scratch_.read_counts(scratch_.sent_counts(), stream);  // synchronizes
    received_.assign(static_cast<size_t>(N), 0);
    std::vector<int64_t> ones(static_cast<size_t>(N), sizeof(int64_t)), at(static_cast<size_t>(N));
    for (int p = 0; p < N; ++p) at[static_cast<size_t>(p)] = p * int64_t{sizeof(int64_t)};
    exchange_in_step(
        step_, me, "dispatch",
        fmt::format("the row counts' exchange through the {} communicator", host_.name()),
        other_ranks(N, me), [&] {
          host_.all_to_all_v(sent_.data(), {ones, at}, received_.data(), {ones, at});
        });

    // Received rows: the own block first (already in place), then each peer's in rank order.
    const int64_t own = sent_[static_cast<size_t>(me)];
    std::vector<int64_t> send_first(static_cast<size_t>(N)), recv_first(static_cast<size_t>(N));
    std::vector<int64_t> send_rows = sent_, recv_rows = received_;
    send_rows[static_cast<size_t>(me)] = 0;
    recv_rows[static_cast<size_t>(me)] = 0;
    num_received_ = own;
    for (int p = 0; p < N; ++p) {
      send_first[static_cast<size_t>(p)] = p * block_rows;
      recv_first[static_cast<size_t>(p)] = p == me ? 0 : num_received_;
      if (p != me) num_received_ += received_[static_cast<size_t>(p)];
    }
    recv_first_ = recv_first;
    peer_rows_in_ = recv_rows;
    peer_rows_out_ = send_rows;
    row_peers_.clear();
    for (int p = 0; p < N; ++p) {
      if (send_rows[static_cast<size_t>(p)] > 0 || recv_rows[static_cast<size_t>(p)] > 0) {
        row_peers_.push_back(p);
      }
    }
    grow_keeping(recv_rows_, static_cast<size_t>(num_received_ * H) * 2,
                 static_cast<size_t>(own * H) * 2, stream);
    grow_keeping(recv_ids_, static_cast<size_t>(num_received_ * k) * 4,
                 static_cast<size_t>(own * k) * 4, stream);
    grow_keeping(recv_weights_, static_cast<size_t>(num_received_ * k) * 4,
                 static_cast<size_t>(own * k) * 4, stream);
    grown<uint16_t>(partial_, num_received_ * H);

    const Splits rows_out = splits(send_rows, send_first, H * 2);
    const Splits rows_in = splits(recv_rows, recv_first, H * 2);
    const Splits meta_out = splits(send_rows, send_first, k * 4);
    const Splits meta_in = splits(recv_rows, recv_first, k * 4);
    exchange_in_step(step_, me, "dispatch",
                     fmt::format("the {} all-to-alls of rows, ids and weights", device_.name()),
                     row_peers_, [&] {
                       auto a = device_.start_all_to_all_v(rows, rows_out.view(), recv_rows_.data(),
                                                           rows_in.view());
                       auto b = device_.start_all_to_all_v(ids, meta_out.view(), recv_ids_.data(),
                                                           meta_in.view());
                       auto c = device_.start_all_to_all_v(weights, meta_out.view(),
                                                           recv_weights_.data(), meta_in.view());
                       a->wait();
                       b->wait();
                       c->wait();
                     });
  }

  ReceivedRows received() const override {
    ReceivedRows r;
    r.rows = recv_rows_.data();
    r.ids = static_cast<const int32_t*>(recv_ids_.data());
    r.weights = static_cast<const float*>(recv_weights_.data());
    r.num_rows = num_received_;
    r.partial = partial_.data();
    return r;
  }

  // Peers' partial rows go back through NCCL; the own ones are summed where the experts left
  // them (the front of the partial buffer).
  void combine(void* out, cudaStream_t stream) override {
    const int N = shape_.num_ranks, me = shape_.rank;
    const int64_t H = shape_.hidden_size;
    uint16_t* back = grown<uint16_t>(combine_rows_, N * block_rows_ * H);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (experts before combine)");
    std::vector<int64_t> block_first(static_cast<size_t>(N));
    for (int p = 0; p < N; ++p) block_first[static_cast<size_t>(p)] = p * block_rows_;
    const Splits out_splits = splits(peer_rows_in_, recv_first_, H * 2);
    const Splits in_splits = splits(peer_rows_out_, block_first, H * 2);
    exchange_in_step(
        step_, me, "combine", fmt::format("the {} all-to-all of the partial rows", device_.name()),
        row_peers_,
        [&] { device_.all_to_all_v(partial_.data(), out_splits.view(), back, in_splits.view()); });

    CombineSumArgs sum;
    for (int d = 0; d < N; ++d) {
      sum.rows[d] = d == me ? partial_.data() : static_cast<void*>(back + d * block_rows_ * H);
    }
    sum.slot_of = slot_of_;
    sum.num_tokens = num_tokens_;
    sum.hidden_size = H;
    sum.num_ranks = N;
    sum.out = out;
    sum.status = scratch_.status();
    combine_sum(sum, stream);
  }

  Status read_status(cudaStream_t stream) const override { return scratch_.read_status(stream); }
  void clear_status(cudaStream_t stream) const override { scratch_.clear_status(stream); }
  std::vector<int64_t> rows_sent(cudaStream_t) const override { return sent_; }
  std::vector<int64_t> rows_received(cudaStream_t) const override { return received_; }

 private:
  Communicator& host_;
  Communicator& device_;
  PathShape shape_;
  mutable StepScratch scratch_;
  DeviceBuffer send_rows_, send_ids_, send_weights_;  // [N, M, *]: the own block stays unused
  DeviceBuffer recv_rows_, recv_ids_, recv_weights_, partial_, combine_rows_;
  int32_t* slot_of_ = nullptr;
  int64_t num_tokens_ = 0, block_rows_ = 1, num_received_ = 0;
  std::vector<int64_t> sent_, received_, recv_first_;
  std::vector<int64_t> peer_rows_in_, peer_rows_out_;  // sent_ / received_ with 0 for this rank
  std::vector<int> row_peers_;  // the other ranks this rank sends rows to or receives rows from
  uint32_t step_ = 0;           // steps dispatched, as the device's step number counts them
};

}  // namespace

std::unique_ptr<DataPath> make_high_throughput_path(Communicator& host, Communicator& device,
                                                    const PathShape& shape) {
  return std::make_unique<HighThroughputPath>(host, device, shape);
}

}  // namespace moe::cuda::ep
