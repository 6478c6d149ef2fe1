#pragma once
// Errors that every rank must agree on before anyone enters the next collective, so that a problem seen on
// one rank (a file only rank 0 reads, a write that failed on rank 3) is a clear error on every rank instead of
// a hang. Three shapes cover every case:
//
//   agree_on_error(comm, local_error)       each rank brings its own error ("" when fine); if any rank has one,
//                                           every rank throws the same UsageError (the lowest failing rank's)
//   root_does(comm, [&] { ... })            the work runs on the root only (reading a file once for N ranks);
//                                           what it throws becomes the same UsageError on every rank
//   broadcast_string(comm, text, root)      the root's string on every rank (a deck's text, a file's format)
//   every_rank_does(comm, [&] { ... })      the work runs on every rank; any rank's exception becomes the same
//                                           UsageError on all of them (after `cleanup`, if given)
//
// All are collective over `comm`: every rank must call them, in the same order.
#include <mpi.h>

#include <exception>
#include <functional>
#include <string>

namespace fsdpp {

void agree_on_error(MPI_Comm comm, const std::string& local_error);

std::string broadcast_string(MPI_Comm comm, std::string text, int root = 0);

// Waits for a nonblocking collective by polling with short sleeps instead of blocking: Open MPI's blocking calls
// spin a core, and a rank waiting for a slow one (rank 0's fsync, a large read) would take that core from
// training or a background writer.
void wait_gently(MPI_Request& request);

[[noreturn]] void throw_agreed_error(const std::string& message);  // throws UsageError(message)

template <class Work> void root_does(MPI_Comm comm, Work&& work, int root = 0) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  std::string error;
  if (rank == root) {
    try {
      work();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "unknown error on rank " + std::to_string(root);
    }
  }
  error = broadcast_string(comm, std::move(error), root);
  if (!error.empty()) throw_agreed_error(error);
}

template <class Work> void every_rank_does(MPI_Comm comm, Work&& work, const std::function<void()>& cleanup = {}) {
  std::string error;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  try {
    agree_on_error(comm, error);
  } catch (...) {
    if (cleanup) cleanup();
    throw;
  }
}

}  // namespace fsdpp
