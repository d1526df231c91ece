// MPI for CPU hosts: the Communicator of moe/communicator.h over MPI point-to-point messages, in
// the library target moe::mpi (CMake option MOE_WITH_MPI, on when MPI is found). Run programs
// under `mpirun -np N`; one process per rank.
//
// A progress thread owned by the communicator makes every MPI call after set-up, so operations
// move while the caller computes (two-batch overlap) and every wait has a deadline: it polls
// non-blocking requests and, past the communicator's timeout, cancels what it can and throws
// moe::Error naming the peers whose messages never came. docs/parallel.md says what a timeout
// does and does not guarantee.
#pragma once

#include <memory>

#include "moe/communicator.h"

namespace moe {

// MPI_Init_thread and MPI_Finalize for one program (create it first thing in main). Throws
// moe::Error when MPI cannot give MPI_THREAD_SERIALIZED, which the progress thread needs.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();  // MPI_Finalize (skipped after abort)
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }

  // Ends every process of the job with `code` (MPI_Abort). After a failed step a program cannot
  // finalize cleanly (peers may be stuck in an operation), so this is how it exits; the library
  // itself never calls it.
  [[noreturn]] void abort(int code);

 private:
  int rank_ = 0;
  int size_ = 1;
};

struct MpiOptions {
  // 0: hosts as MPI sees them (ranks sharing memory). N > 0: pretend hosts of N consecutive ranks,
  // to exercise the same-host / cross-host split of the counters on one machine.
  int ranks_per_host = 0;
};

// A communicator over a duplicate of MPI_COMM_WORLD (a collective: every rank calls it). One may
// live at a time per process. Throws moe::Error when no MpiSession is active or another MPI
// communicator still lives.
std::unique_ptr<Communicator> make_mpi_communicator(MpiOptions options = {});

}  // namespace moe
