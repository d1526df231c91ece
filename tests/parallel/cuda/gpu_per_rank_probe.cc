// Exits 0 when every rank of this mpirun job has a CUDA device of its own on its host (and there
// are at least two ranks), 77 otherwise (rank 0 prints why): the skip rule of the GPU
// expert-parallel tests, for the scripts that run the moe command line on GPUs.
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "moe/error.h"
#include "moe/mpi_communicator.h"
#include "parallel/cuda/gpu_per_rank.h"

int main(int argc, char** argv) {
  moe::MpiSession session(&argc, &argv);
  try {
    std::unique_ptr<moe::Communicator> world = moe::make_mpi_communicator();
    world->set_timeout(std::chrono::seconds(60));
    const std::optional<int> gpu = moe::testing::gpu_of_this_rank(*world);
    world->barrier();
    return gpu ? 0 : moe::testing::kSkipped;
  } catch (const moe::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", session.world_rank(), e.what());
    session.abort(1);
  }
}
