#pragma once
// Which checkpoint a run resumes from (checkpoint.resume), decided once on rank 0 and agreed on every rank.
//
// <dir>/latest is a hint. When it names a checkpoint whose layout checks out (layout.hpp), that one is used.
// When it is missing, empty, garbage, or names a missing or damaged file, the folder is scanned for the newest
// step_<N>.h5 whose layout checks out, and the log says so. A run never starts over by mistake:
//   resume: auto  starts fresh only when the folder holds no step_<N>.h5 at all;
//   resume: true  with no checkpoint is an error saying what the folder holds;
//   either mode   with checkpoints of which none checks out is an error listing each file and why (nothing is
//                 loaded, nothing deleted).
// The scan checks metadata only; load_checkpoint then verifies every shard's checksum as it reads.
#include "fsdpp/config/deck_enums.hpp"

#include <mpi.h>

#include <optional>
#include <string>

namespace fsdpp {

struct ResumeChoice {
  std::optional<std::string> path;  // the checkpoint to load; nullopt: start fresh (or resume is off)
  std::string log;                  // what rank 0 should log about the choice ("" when there is nothing to say)
};

// Collective over `comm`: every rank returns the same choice or throws the same UsageError.
// `resume_path` is used with ResumeMode::path only.
ResumeChoice choose_resume(MPI_Comm comm, const std::string& dir, ResumeMode mode, const std::string& resume_path = {});

// The same decision, serial (rank 0's part; for tools and tests).
ResumeChoice choose_resume_serial(const std::string& dir, ResumeMode mode, const std::string& resume_path = {});

// The log line of a resume at or past the last step ("" otherwise): it trains nothing, and says so.
std::string resume_past_end_note(const std::string& path, std::int64_t step, std::int64_t train_steps);

}  // namespace fsdpp
