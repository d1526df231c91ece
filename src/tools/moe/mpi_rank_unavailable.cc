// run_as_mpi_rank in a build without MPI (MOE_WITH_MPI off).
#include "moe/error.h"
#include "tools/moe/ep_options.h"

namespace moe::cli {

void run_as_mpi_rank(const EpSettings&, const std::function<void(Communicator&)>&) {
  fail(
      "--ep: this moe was built without MPI; install OpenMPI (scripts/install-deps) and "
      "configure with -DMOE_WITH_MPI=ON");
}

}  // namespace moe::cli
