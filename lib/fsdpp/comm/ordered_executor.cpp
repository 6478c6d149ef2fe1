#include "fsdpp/comm/ordered_executor.hpp"

namespace fsdpp {

void TaskState::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

void TaskState::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

void TaskState::wait_quietly() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
}

bool TaskState::done() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

OrderedExecutor::OrderedExecutor(bool threaded) : threaded_(threaded) {
  if (threaded_) worker_ = std::thread([this] { worker_loop(); });
}

OrderedExecutor::~OrderedExecutor() {
  if (!threaded_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

std::shared_ptr<TaskState> OrderedExecutor::submit(std::function<void()> task) {
  auto state = std::make_shared<TaskState>();
  if (!threaded_) {
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    state->finish(error);
    return state;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.emplace_back(std::move(task), state);
  }
  cv_.notify_all();
  return state;
}

void OrderedExecutor::run_inline(const std::function<void()>& task) {
  if (threaded_) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }
  std::lock_guard<std::mutex> exec(exec_mutex_);
  task();
}

void OrderedExecutor::worker_loop() {
  for (;;) {
    std::pair<std::function<void()>, std::shared_ptr<TaskState>> item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      // Drain before stopping: a started collective must finish, or the peer ranks would hang in it.
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> exec(exec_mutex_);
      try {
        item.first();
      } catch (...) {
        error = std::current_exception();
      }
    }
    item.second->finish(error);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace fsdpp
