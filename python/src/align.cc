// align_block_size(): vLLM's moe_align_block_size, grouping (token, expert) pairs by expert in
// blocks of block_m.
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "devices.h"
#include "moe/align.h"
#include "tensors.h"

namespace moe::python {

namespace nb = nanobind;

namespace {

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

Tensor int32_tensor(const std::vector<int32_t>& values) {
  Tensor tensor(DType::kI32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), tensor.data<int32_t>());
  return tensor;
}

// On the GPU: the kernel writes worst-case-sized arrays, the count is read back (waiting for the
// stream), and the results are the first num_tokens_post_padded entries of those arrays.
std::tuple<nb::object, nb::object, int64_t> align_on_gpu(const ArrayArg& ids, int64_t num_experts,
                                                         int64_t block_m, const ArrayArg& map,
                                                         const CallDevice& call,
                                                         nb::handle topk_ids) {
  // Sizes come from arguments not checked yet: the C++ call reports a bad num_experts or block_m
  // before it looks at the buffers, so those get a placeholder size instead of a huge one.
  const int64_t num_pairs = ids.view.numel();
  const bool sizes_valid = num_experts >= 1 && num_experts <= kMaxInt32 && block_m >= 1 &&
                           num_pairs < kMaxInt32 &&
                           block_m - 1 <= (kMaxInt32 - num_pairs) / num_experts;
  const int64_t capacity =
      sizes_valid ? max_num_pairs_post_padded(num_pairs, num_experts, block_m) : 0;
  NewArray sorted = new_array(DType::kI32, {capacity}, call, topk_ids);
  NewArray blocks = new_array(DType::kI32, {sizes_valid ? capacity / block_m : 0}, call, topk_ids);
  NewArray count = new_array(DType::kI32, {1}, call, topk_ids);
  int32_t num_post_padded = 0;
  {
    nb::gil_scoped_release release;
    align_block_size(ids.view, num_experts, block_m, map.view, sorted.view, blocks.view, count.view,
                     call.stream);
    copy_to_host(call, count.view.as<int32_t>(), &num_post_padded, 1);
  }
  return {leading(sorted, num_post_padded, call), leading(blocks, num_post_padded / block_m, call),
          num_post_padded};
}

std::tuple<nb::object, nb::object, int64_t> align_py(nb::handle topk_ids, int64_t num_experts,
                                                     int64_t block_m, nb::handle expert_map,
                                                     nb::handle stream) {
  const ArrayArg ids = borrow_array(topk_ids, "topk_ids");
  const ArrayArg map = borrow_optional(expert_map, "expert_map");
  const CallDevice call = call_device({&ids, &map}, topk_ids, stream);
  const DeviceScope scope(call);
  if (call.device == Device::kCuda) {
    return align_on_gpu(ids, num_experts, block_m, map, call, topk_ids);
  }
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
      nb::arg("block_m"), nb::arg("expert_map") = nb::none(), nb::kw_only(),
      nb::arg("stream") = nb::none(),
      R"(Groups the (token, expert) pairs of topk_ids [M, k] int32 by expert, in blocks of block_m.

Pair p = t * k + j is slot j of token t. Returns (sorted_token_ids, expert_ids,
num_tokens_post_padded): sorted_token_ids [num_tokens_post_padded] int32 lists the pair ids by
ascending expert (ascending pair id within an expert), each expert's run padded with the sentinel
M * k to a multiple of block_m; expert_ids [num_tokens_post_padded / block_m] int32 names each
block's expert (the local id from expert_map [num_experts] int32, or -1 where the expert is not
local); experts without pairs get no block. Unlike vLLM, whose buffers are sized for the worst
case, the arrays have exactly num_tokens_post_padded entries, which is returned as an int.
Arrays are torch tensors for a torch topk_ids, else NumPy arrays.

A CUDA topk_ids runs on the GPU on `stream` (a cudaStream_t as an int; default: torch's current
stream for a torch topk_ids, else the legacy default stream 0), up to 8192 experts. Returning
num_tokens_post_padded as an int waits for the stream. Device memory is not checked on the host:
there an id outside [0, num_experts) gets no slot instead of raising, and an expert_map entry
below -1 counts as not local. The arrays are views of the first entries of GPU buffers sized for
the worst case.)");
}

}  // namespace moe::python
