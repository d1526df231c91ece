// run_as_mpi_rank with MPI (built when MOE_WITH_MPI is on; mpi_rank_unavailable.cc otherwise).
#include <chrono>
#include <cstdio>

#include "moe/error.h"
#include "moe/mpi_communicator.h"
#include "tools/moe/ep_options.h"

namespace moe::cli {

void run_as_mpi_rank(const EpSettings& settings, const std::function<void(Communicator&)>& body) {
  MpiSession session(nullptr, nullptr);
  try {
    std::unique_ptr<Communicator> comm = make_mpi_communicator({settings.ranks_per_host});
    comm->set_timeout(std::chrono::milliseconds(settings.timeout_ms));
    body(*comm);
    comm->barrier();  // nobody finalizes while a peer still needs it
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe: error: rank %d: %s\n", session.world_rank(), e.what());
    std::fflush(stderr);
    session.abort(1);
  }
}

}  // namespace moe::cli
