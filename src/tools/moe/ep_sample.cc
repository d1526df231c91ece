#include "tools/moe/ep_sample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tools/moe/batch_report.h"

namespace moe::cli {

Tensor ep_hidden(int64_t tokens, int64_t hidden_size, DType dtype, uint64_t seed, int rank) {
  return synthetic_hidden(
      tokens, hidden_size, dtype,
      seed + static_cast<uint64_t>(tokens) * 1000 + static_cast<uint64_t>(rank));
}

std::vector<int64_t> sampled_tokens(int64_t M, int64_t sample) {
  sample = std::min(sample, M);
  std::vector<int64_t> tokens(static_cast<size_t>(std::max<int64_t>(sample, 0)));
  for (int64_t i = 0; i < sample; ++i) tokens[i] = sample == 1 ? 0 : i * (M - 1) / (sample - 1);
  return tokens;
}

Tensor pick_rows(const TensorView& t, const std::vector<int64_t>& tokens) {
  const int64_t H = t.size(1);
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(t.dtype);
  Tensor picked(t.dtype, {static_cast<int64_t>(tokens.size()), H});
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::memcpy(picked.data<char>() + i * row_bytes,
                static_cast<const char*>(t.data) + tokens[i] * row_bytes, row_bytes);
  }
  return picked;
}

Tensor gather_rows_on_rank0(Communicator& comm, const Tensor& rows) {
  const int N = comm.size();
  const int64_t bytes = static_cast<int64_t>(rows.nbytes());
  std::vector<int64_t> send_counts(N, 0), zeros(N, 0), recv_counts(N, 0), recv_displs(N, 0);
  send_counts[0] = bytes;
  Tensor all;
  if (comm.rank() == 0) {
    all = Tensor(rows.dtype(), {N * rows.size(0), rows.size(1)});
    for (int p = 0; p < N; ++p) {
      recv_counts[p] = bytes;
      recv_displs[p] = p * bytes;
    }
  }
  comm.all_to_all_v(rows.data<void>(), {send_counts, zeros},
                    all.defined() ? all.data<void>() : nullptr, {recv_counts, recv_displs});
  return all;
}

double max_rel_error(const Tensor& got, const Tensor& expected) {
  const Tensor g = Tensor::copy_of(got, DType::kF32);
  double max_error = 0, max_expected = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double e = expected.data<float>()[i];
    max_expected = std::max(max_expected, std::abs(e));
    const double error = std::abs(static_cast<double>(g.data<float>()[i]) - e);
    max_error = std::isnan(error) ? INFINITY : std::max(max_error, error);
  }
  return max_error / std::max(max_expected, 1e-30);
}

}  // namespace moe::cli
