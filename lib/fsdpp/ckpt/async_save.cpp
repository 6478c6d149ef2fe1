#include "fsdpp/ckpt/async_save.hpp"

#include "fsdpp/runtime/error.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>

namespace fsdpp {
namespace {
constexpr int kWriterNice = 19;  // Linux: the lowest share of a core against nice-0 training threads
}  // namespace

AsyncCheckpointer::AsyncCheckpointer(MPI_Comm comm, CheckpointOnError on_error) : on_error_(on_error) {
  FSDPP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
}

AsyncCheckpointer::~AsyncCheckpointer() {
  if (writing_.valid()) writing_.wait();  // the buffers it writes from must outlive it (never committed)
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void AsyncCheckpointer::start(CheckpointSnapshot snapshot, const std::string& dir, int keep_last) {
  wait();
  started_ = std::chrono::steady_clock::now();
  snapshot_ = std::move(snapshot);
  try {
    save_ = prepare_checkpoint(comm_, dir, snapshot_, keep_last);
  } catch (const UsageError& e) {  // agreed on every rank: every rank takes the same branch
    const std::int64_t step = snapshot_.progress.step;
    snapshot_ = CheckpointSnapshot{};
    if (on_error_ == CheckpointOnError::abort) throw;
    report_failed_save(dir, step, e.what());
    return;
  }
  writing_ = std::async(std::launch::async, [this]() -> std::string {
    // Training keeps the cores: the writer runs at a lower priority and uses what training leaves idle.
    setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), kWriterNice);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      write_shards(save_, snapshot_);
      write_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return {};
    } catch (const std::exception& e) {
      return e.what();
    }
  });
}

std::optional<SaveResult> AsyncCheckpointer::finish() {
  const std::string error = writing_.get();
  const std::int64_t step = snapshot_.progress.step;
  snapshot_ = CheckpointSnapshot{};  // release the host copies
  try {
    const auto t0 = std::chrono::steady_clock::now();
    SaveResult result = commit_checkpoint(comm_, save_, error);
    const auto now = std::chrono::steady_clock::now();
    result.commit_seconds = std::chrono::duration<double>(now - t0).count();
    result.write_seconds = write_seconds_;
    result.seconds = std::chrono::duration<double>(now - started_).count();
    return result;
  } catch (const UsageError& e) {
    if (on_error_ == CheckpointOnError::abort) throw;
    report_failed_save(save_.dir, step, e.what());
    return std::nullopt;
  }
}

std::optional<SaveResult> AsyncCheckpointer::poll() {
  if (!writing_.valid()) return std::nullopt;
  int written = writing_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  MPI_Allreduce(MPI_IN_PLACE, &written, 1, MPI_INT, MPI_MIN, comm_);
  if (!written) return std::nullopt;
  return finish();
}

std::optional<SaveResult> AsyncCheckpointer::wait() {
  if (!writing_.valid()) return std::nullopt;
  return finish();
}

}  // namespace fsdpp
