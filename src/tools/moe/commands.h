// The subcommands of `moe`. Each add_* registers its options on `app` and the code to run.
#pragma once

#include <CLI/CLI.hpp>

namespace moe::cli {

void add_run_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_cpu_command(CLI::App& app);
void add_forward_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_trace_command(CLI::App& app);
void add_place_command(CLI::App& app);
void add_eplb_command(CLI::App& app);
void add_tune_command(CLI::App& app);

}  // namespace moe::cli
