#include "fsdpp/ckpt/async_save.hpp"

#include "fsdpp/runtime/error.hpp"

#include <chrono>

namespace fsdpp {

AsyncCheckpointer::AsyncCheckpointer(MPI_Comm comm) {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  FSDPP_REQUIRE(level >= MPI_THREAD_MULTIPLE, "checkpoint.async needs MPI_THREAD_MULTIPLE, and this MPI provides "
                "less; set checkpoint.async: false");
  FSDPP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (result_.valid()) result_.wait();  // an unfinished write must not outlive its communicator
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void AsyncCheckpointer::start(CheckpointSnapshot snapshot, const std::string& dir, int keep_last) {
  wait();
  const MPI_Comm comm = comm_;
  result_ = std::async(std::launch::async, [comm, dir, keep_last, snapshot = std::move(snapshot)]() {
    return write_checkpoint(comm, dir, snapshot, keep_last);
  });
}

std::optional<SaveResult> AsyncCheckpointer::wait() {
  if (!result_.valid()) return std::nullopt;
  return result_.get();
}

bool AsyncCheckpointer::finished() const {
  return result_.valid() && result_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

}  // namespace fsdpp
