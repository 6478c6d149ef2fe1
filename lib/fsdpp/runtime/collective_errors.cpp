#include "fsdpp/runtime/collective_errors.hpp"

#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>

namespace fsdpp {
void wait_gently(MPI_Request& request) {
  for (int done = 0;;) {
    FSDPP_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

void throw_agreed_error(const std::string& message) { throw UsageError(message); }

std::string broadcast_string(MPI_Comm comm, std::string text, int root) {
  long long length = static_cast<long long>(text.size());
  FSDPP_MPI_CHECK(MPI_Bcast(&length, 1, MPI_LONG_LONG, root, comm));
  text.resize(static_cast<std::size_t>(length));
  for (long long at = 0; at < length; at += INT_MAX) {
    const int count = static_cast<int>(std::min<long long>(INT_MAX, length - at));
    FSDPP_MPI_CHECK(MPI_Bcast(text.data() + at, count, MPI_CHAR, root, comm));
  }
  return text;
}

void agree_on_error(MPI_Comm comm, const std::string& local_error) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  int first = local_error.empty() ? INT_MAX : rank;
  MPI_Request request;
  FSDPP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm, &request));
  wait_gently(request);
  if (first == INT_MAX) return;
  throw_agreed_error(broadcast_string(comm, rank == first ? local_error : std::string(), first));
}

}  // namespace fsdpp
