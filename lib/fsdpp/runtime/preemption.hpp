#pragma once
// Preemption and time limits: Slurm sends SIGUSR1 (--signal=B:USR1@lead, forwarded to the job step) or
// SIGTERM before it stops a job. The handlers only set a flag; the trainer combines the ranks' flags with one
// small all-reduce at each step boundary (signals reach nodes at different times), then saves a checkpoint
// and exits with kPreemptedExitCode, on which a requeue script runs `scontrol requeue`.
//
// Launchers: srun passes SIGTERM and SIGINT on to the ranks (and scancel signals them directly). Open MPI 4.1's
// mpiexec forwards only SIGUSR1, SIGUSR2 (and job control) to the ranks; on SIGTERM or SIGINT it kills the
// job (SIGTERM to the ranks, SIGKILL odls_base_sigkill_timeout = 1 s later, exit code 1), and
// ess_base_forward_signals refuses SIGTERM and SIGINT. share/scripts/fsdpp-mpiexec wraps mpiexec and turns
// SIGTERM, SIGINT and SIGHUP into SIGUSR1 (tests/cli/preempt_signals.sh).
namespace fsdpp {

inline constexpr int kPreemptedExitCode = 85;

void install_preemption_handlers();            // SIGUSR1, SIGTERM and (once) SIGINT
int preemption_signal();                       // the signal received on this rank, 0 if none

}  // namespace fsdpp
