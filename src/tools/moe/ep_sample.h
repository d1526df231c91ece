// The tokens `moe run --ep` checks: each rank's synthetic batch, an evenly spaced sample of it,
// gathered on rank 0, and their error against the float64 reference. Shared by the CPU and GPU
// runs so both check the same tokens the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/communicator.h"
#include "moe/tensor.h"

namespace moe::cli {

// The hidden states rank `rank` routes in the batch of `tokens` tokens per rank: deterministic in
// (seed, tokens, rank), so rank 0 can rebuild any rank's batch.
Tensor ep_hidden(int64_t tokens, int64_t hidden_size, DType dtype, uint64_t seed, int rank);

// `sample` tokens of a batch of M, evenly spaced, first and last included (fewer when M is).
std::vector<int64_t> sampled_tokens(int64_t M, int64_t sample);

// Rows `tokens` of the host tensor `t` [M, H], as a new tensor.
Tensor pick_rows(const TensorView& t, const std::vector<int64_t>& tokens);

// Every rank's `rows` [n, H] stacked in rank order on rank 0 (n is the same on every rank); an
// undefined tensor elsewhere. A collective.
Tensor gather_rows_on_rank0(Communicator& comm, const Tensor& rows);

// max |got - expected| / max |expected| (infinite where got holds a NaN); got in any float dtype,
// expected f32 of the same shape.
double max_rel_error(const Tensor& got, const Tensor& expected);

}  // namespace moe::cli
