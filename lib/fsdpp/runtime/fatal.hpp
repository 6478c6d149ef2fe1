#pragma once
// The one way a rank ends the whole job on an error only it sees (a collective watchdog timeout, an NCCL
// asynchronous error, an exception that reached main): print "[rank r] error: <message>", run the hook that
// saves what explains it (the flight recorder dumps this rank's records and asks the other ranks for theirs,
// observe/flight_service.hpp) and print what it says, then MPI_Abort so that the launcher ends every rank within
// seconds. Safe to call from any thread: a second caller waits for the first one's abort.
#include <string>

namespace fsdpp {

// Called once before the abort, with the message; returns lines to print after it ("" for none).
using AbortHook = std::string (*)(const std::string& message);
void set_abort_hook(AbortHook hook);  // nullptr: none

[[noreturn]] void abort_job(const std::string& message, int code = 1);

}  // namespace fsdpp
