// Tuned CUDA plans: which grouped-GEMM kernel and block_m run one (GPU, E, H, I, k) shape at each
// token count M. One JSON file per shape, named like vLLM's fused_moe configs:
//
//   E=128,H=2048,I=768,k=8,device_name=NVIDIA_H200.json
//   {"1": {"kernel": "stream", "block_m": 1, "tiny_batch": true},
//    "64": {"kernel": "wgmma", "block_m": 64, "tiny_batch": false}, ...}
//
// `moe tune` writes them (configs/cuda in the repo); cuda_plan_choice.h reads them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "kernels/cuda/fused_experts.h"

namespace moe::cuda_plans {

// "stream", "mma", "wgmma", "tma", "tma_eager", "tma_pair", "tma_dynamic": the
// kernel field of a table entry.
std::string_view kernel_name(cuda::GemmKernel kernel);

// The plan's short name, as `moe bench` prints it: "tiny/1", "stream/4", "mma/32", "wgmma/128".
std::string plan_name(const cuda::ExpertsPlan& plan);
// The inverse of plan_name; throws moe::Error naming `name` when it is not one.
cuda::ExpertsPlan parse_plan_name(std::string_view name);

// Plans keyed by the token count M they were tuned at.
using PlanTable = std::map<int64_t, cuda::ExpertsPlan>;

// The file name of the table for one shape on one GPU. Spaces in the device name (as
// cudaGetDeviceProperties gives it, "NVIDIA H200") become '_', and so does '/', so the name is
// always one path component.
std::string table_file_name(std::string_view device_name, int64_t num_experts, int64_t hidden_size,
                            int64_t intermediate_size, int64_t top_k);

// Parses a table file's text. Throws moe::Error naming `source`, the entry and the problem:
// not a JSON object, keys that are not positive integers, unknown fields, kernel names or
// block_m values no kernel takes, tiny_batch with anything but stream/1 or decode/1, decode
// without tiny_batch, an empty table.
PlanTable parse_table(std::string_view json_text, std::string_view source);

// The file text: one entry per line, M ascending; parse_table(format_table(t)) == t.
std::string format_table(const PlanTable& table);

// The plan of the entry whose M is closest to `num_tokens` (as vLLM looks up its configs); on a
// tie the larger M wins, since a plan tuned for more rows only pads, while one tuned for fewer
// may re-read each expert's weights per block. `table` must not be empty.
cuda::ExpertsPlan closest_plan(const PlanTable& table, int64_t num_tokens);

}  // namespace moe::cuda_plans
