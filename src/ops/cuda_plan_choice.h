// Which plan a CUDA fused_experts call runs: the tuned one when a plan table exists for the GPU
// and the shape and its plan can run the call, else cuda::default_plan.
//
// The tables: the repo's configs/cuda/*.json, compiled into the library, then every *.json in
// the folder MOE_CUDA_TUNING_DIR names, if it is set; a file there replaces the compiled-in table
// of the same name. Tables are keyed by the experts the weights hold (E local to this rank, as
// vLLM keys its configs), H, I and k.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "kernels/cuda/fused_experts.h"
#include "kernels/experts_problem.h"
#include "ops/cuda_plan_table.h"

namespace moe::cuda_plans {

inline constexpr const char* kTuningDirVariable = "MOE_CUDA_TUNING_DIR";

// Tables keyed by file name (table_file_name).
using PlanTables = std::map<std::string, PlanTable>;

// The compiled-in tables, then those of `tuning_dir` on top (none when it is empty). Throws
// moe::Error naming the file for a table that does not parse or a *.json whose name is not a
// table name, and naming the folder when it cannot be listed. Other files there are ignored.
PlanTables load_tables(const std::string& tuning_dir);

// One table file, parsed: throws moe::Error naming `path` when it cannot be read, is larger than a
// table can be, or does not parse (parse_table).
PlanTable read_table_file(const std::filesystem::path& path);

// load_tables for the current value of MOE_CUDA_TUNING_DIR; loaded on first use and again only
// when the variable's value changes (the folder is not watched).
std::shared_ptr<const PlanTables> current_tables();

// The plan for `problem` on the GPU named `device_name` (cudaGetDeviceProperties' name) from
// `tables`: the entry of closest M in the shape's table when it can run `problem` (a tiny-batch
// entry cannot with an expert map, a wgmma entry cannot off Hopper), else cuda::default_plan.
cuda::ExpertsPlan choose_plan(const ExpertsProblem& problem, std::string_view device_name,
                              const PlanTables& tables);
// The same from current_tables().
cuda::ExpertsPlan choose_plan(const ExpertsProblem& problem, std::string_view device_name);

// The name CUDA device `device` goes by in table names and choose_plan
// (cudaGetDeviceProperties' name), asked of the driver once per thread and device.
const std::string& device_name(int device);

}  // namespace moe::cuda_plans
