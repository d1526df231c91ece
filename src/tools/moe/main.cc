// moe: the command line of moe-engine. The library never exits on bad input; this is the one
// place that turns a moe::Error into a message and an exit status.
#include <cstdio>
#include <exception>

#include "tools/moe/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"moe-engine: Mixture-of-Experts layers, checked against a float64 reference"};
  app.require_subcommand(1);
  moe::cli::add_run_command(app);
  moe::cli::add_bench_command(app);
  moe::cli::add_cpu_command(app);
  moe::cli::add_forward_command(app);
  moe::cli::add_info_command(app);
  moe::cli::add_plan_command(app);
  moe::cli::add_trace_command(app);
  moe::cli::add_place_command(app);
  moe::cli::add_eplb_command(app);
  moe::cli::add_tune_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {  // moe::Error, and out-of-memory and the like
    std::fprintf(stderr, "moe: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
