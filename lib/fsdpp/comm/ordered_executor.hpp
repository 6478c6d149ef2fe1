#pragma once
// OrderedExecutor: runs one communicator's collectives one at a time, in the order they were started, on a
// thread of its own. Collectives on one MPI communicator must be issued in the same order on every rank; a
// FIFO per communicator keeps that order while the caller goes on computing (FSDP's prefetch). The thread
// needs MPI_THREAD_MULTIPLE; without it the executor runs each task at submit time, on the caller's thread.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace fsdpp {

class TaskState {
 public:
  void finish(std::exception_ptr error);
  void wait();  // blocks until finished, then rethrows the task's exception, if any
  void wait_quietly();  // blocks until finished; for destructors, which must not throw
  bool done();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class OrderedExecutor {
 public:
  explicit OrderedExecutor(bool threaded);
  ~OrderedExecutor();
  OrderedExecutor(const OrderedExecutor&) = delete;
  OrderedExecutor& operator=(const OrderedExecutor&) = delete;

  std::shared_ptr<TaskState> submit(std::function<void()> task);
  // Runs `task` on the caller's thread once every earlier task has finished: a blocking collective then
  // costs no thread hand-off, which matters for messages of a few hundred microseconds.
  void run_inline(const std::function<void()>& task);
  bool threaded() const { return threaded_; }

 private:
  void worker_loop();

  const bool threaded_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<TaskState>>> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::mutex exec_mutex_;  // held while a task runs, on whichever thread
  std::thread worker_;
};

}  // namespace fsdpp
