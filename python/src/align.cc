// align_block_size(): vLLM's moe_align_block_size, grouping (token, expert) pairs by expert in
// blocks of block_m.
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "moe/align.h"
#include "tensors.h"

namespace moe::python {

namespace nb = nanobind;

namespace {

Tensor int32_tensor(const std::vector<int32_t>& values) {
  Tensor tensor(DType::kI32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), tensor.data<int32_t>());
  return tensor;
}

std::tuple<nb::object, nb::object, int64_t> align_py(nb::handle topk_ids, int64_t num_experts,
                                                     int64_t block_m, nb::handle expert_map) {
  const ArrayArg ids = borrow_array(topk_ids, "topk_ids");
  const ArrayArg map = borrow_optional(expert_map, "expert_map");
  Tensor sorted_ids, expert_ids;
  int64_t num_post_padded = 0;
  {
    nb::gil_scoped_release release;
    const AlignedPairs aligned = align_block_size(ids.view, num_experts, block_m, map.view);
    sorted_ids = int32_tensor(aligned.sorted_pair_ids);
    expert_ids = int32_tensor(aligned.expert_ids);
    num_post_padded = aligned.num_pairs_post_padded;
  }
  const Framework framework = framework_of(topk_ids);
  return {to_python(std::move(sorted_ids), framework), to_python(std::move(expert_ids), framework),
          num_post_padded};
}

}  // namespace

void bind_align(nb::module_& m) {
  m.def(
      "align_block_size", &align_py, nb::arg("topk_ids"), nb::arg("num_experts"),
      nb::arg("block_m"), nb::arg("expert_map") = nb::none(),
      R"(Groups the (token, expert) pairs of topk_ids [M, k] int32 by expert, in blocks of block_m.

Pair p = t * k + j is slot j of token t. Returns (sorted_token_ids, expert_ids,
num_tokens_post_padded): sorted_token_ids [num_tokens_post_padded] int32 lists the pair ids by
ascending expert (ascending pair id within an expert), each expert's run padded with the sentinel
M * k to a multiple of block_m; expert_ids [num_tokens_post_padded / block_m] int32 names each
block's expert (the local id from expert_map [num_experts] int32, or -1 where the expert is not
local); experts without pairs get no block. Unlike vLLM, whose buffers are sized for the worst
case, the arrays have exactly num_tokens_post_padded entries, which is returned as an int.
Arrays are torch tensors for a torch topk_ids, else NumPy arrays.)");
}

}  // namespace moe::python
