#pragma once
// Fault injection for checkpoint saves: a test seam kept out of the I/O code. A save calls fault_at(point)
// just before each system call that can fail at that point, and treats a non-zero return as that call's
// errno, so an injected fault takes exactly the path a real one (a full disk, a vanished folder) takes.
// Nothing is armed unless a test arms it (or the app does, from FSDPP_TEST_SAVE_FAULT; see app/).
//
//   stage   creating the .partial file and its metadata (every rank; collective HDF5)
//   write   one shard's bytes into the .partial file (each writing rank; may run on the async writer thread)
//   close   fdatasync and close of the shard file descriptor, and HDF5's close of the file
//   rename  rank 0's rename of step_N.h5.partial to step_N.h5
//   latest  rank 0's write of <dir>/latest.tmp before it replaces <dir>/latest
#include <optional>
#include <string>

namespace fsdpp {

enum class SavePoint { stage, write, close, rename, latest };

struct SaveFault {
  SavePoint point = SavePoint::write;
  int save = 1;       // the n-th save of this process (1-based) that reaches the point
  int rank = -1;      // the rank (of MPI_COMM_WORLD) it hits; -1: every rank
  bool crash = false; // true: the process dies there (MPI_Abort), as a node failure would kill it
  int error = 0;      // the errno it reports when it does not crash (default ENOSPC)
};

// Arms one fault (replacing any armed one); disarm() clears it. Thread-safe.
void arm_save_fault(const SaveFault& fault);
void disarm_save_faults();

// Parses "<point>:<save>[:<rank>][:crash]" (FSDPP_TEST_SAVE_FAULT), e.g. "write:2:1:crash" or "rename:1".
// Throws UsageError naming the text and the accepted form.
SaveFault parse_save_fault(const std::string& text);

// Called by the save code: counts saves (begin_save, once per save on every rank) and answers at each point
// 0 (go on) or the errno to fail with; a crashing fault does not return.
void begin_save();
int fault_at(SavePoint point);

std::string_view to_string(SavePoint point);

}  // namespace fsdpp
