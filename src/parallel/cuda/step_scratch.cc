#include "parallel/cuda/step_scratch.h"

#include "kernels/cuda/check.h"

namespace moe::cuda::ep {
namespace {

// Offsets in the fixed allocation: the status first (8-byte aligned), then 32-bit words.
constexpr size_t kWords = sizeof(Status);

}  // namespace

StepScratch::StepScratch(int num_ranks) : num_ranks_(num_ranks) {
  const size_t bytes = kWords + (3 + 3 * static_cast<size_t>(kMaxRanks)) * sizeof(int32_t);
  fixed_.reserve(bytes);
  check(cudaMemset(fixed_.data(), 0, bytes), "cudaMemset (step scratch)");
  const Status clear{};
  check(cudaMemcpy(fixed_.data(), &clear, sizeof clear, cudaMemcpyHostToDevice),
        "cudaMemcpy (status)");
}

Status* StepScratch::status() const { return static_cast<Status*>(fixed_.data()); }

namespace {
int32_t* word(const DeviceBuffer& buffer, size_t index) {
  return reinterpret_cast<int32_t*>(static_cast<char*>(buffer.data()) + kWords) + index;
}
}  // namespace

uint32_t* StepScratch::dispatch_done() const {
  return reinterpret_cast<uint32_t*>(word(fixed_, 0));
}
uint32_t* StepScratch::step() const { return reinterpret_cast<uint32_t*>(word(fixed_, 1)); }
uint32_t* StepScratch::combine_published() const {
  return reinterpret_cast<uint32_t*>(word(fixed_, 2));
}
int32_t* StepScratch::send_counters() const { return word(fixed_, 3); }
int32_t* StepScratch::sent_counts() const { return word(fixed_, 3 + kMaxRanks); }
int32_t* StepScratch::received_counts() const { return word(fixed_, 3 + 2 * kMaxRanks); }

int32_t* StepScratch::slot_of(int64_t num_tokens) {
  slot_of_.reserve(static_cast<size_t>(std::max<int64_t>(num_tokens, 1) * num_ranks_) *
                   sizeof(int32_t));
  return static_cast<int32_t*>(slot_of_.data());
}

Status StepScratch::read_status(cudaStream_t stream) const {
  Status status;
  check(cudaMemcpyAsync(&status, fixed_.data(), sizeof status, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (status)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return status;
}

void StepScratch::clear_status(cudaStream_t stream) const {
  static const Status clear{};
  check(cudaMemcpyAsync(fixed_.data(), &clear, sizeof clear, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (status)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

std::vector<int64_t> StepScratch::read_counts(const int32_t* counts, cudaStream_t stream) const {
  std::vector<int32_t> host(static_cast<size_t>(num_ranks_));
  check(cudaMemcpyAsync(host.data(), counts, host.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                        stream),
        "cudaMemcpyAsync (counts)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return {host.begin(), host.end()};
}

}  // namespace moe::cuda::ep
