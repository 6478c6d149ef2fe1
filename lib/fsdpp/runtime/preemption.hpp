#pragma once
// Preemption and time limits: Slurm sends SIGUSR1 (--signal=B:USR1@lead, forwarded to the job step) or
// SIGTERM before it stops a job. The handlers only set a flag; the trainer combines the ranks' flags with one
// small all-reduce at each step boundary (signals reach nodes at different times), then saves a checkpoint
// and exits with kPreemptedExitCode, on which a requeue script runs `scontrol requeue`.
#include <mpi.h>

namespace fsdpp {

inline constexpr int kPreemptedExitCode = 85;

void install_preemption_handlers();            // SIGUSR1 and SIGTERM
bool preemption_requested(MPI_Comm comm);      // collective: true on every rank if any rank was signalled
int preemption_signal();                       // the signal received on this rank, 0 if none

}  // namespace fsdpp
