#include "fsdpp/ckpt/dir_lock.hpp"

#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace fsdpp {
namespace fs = std::filesystem;
namespace {

std::string holder_of(int fd) {
  char text[512] = {0};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string s(text, n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s.empty() ? "a process that wrote no host or PID" : s;
}

std::string identity() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return fmt::format("host {} pid {} since {}\n", host, ::getpid(), when);
}

}  // namespace

// With the folder locked no other run is writing into it, so a step_*.h5.partial there is what a crashed
// save left behind: never committed, never named by 'latest', safe to delete.
static void remove_stale_partials(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.size() < 8 || name.substr(name.size() - 8) != ".partial") continue;
    std::error_code removed;
    fs::remove(entry.path(), removed);
    if (!removed) Log::info("checkpoint.dir: removed {}, left by a save that never completed", entry.path().string());
  }
}

CheckpointDirLock::CheckpointDirLock(MPI_Comm comm, const std::string& dir, bool enabled) {
  if (!enabled) return;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  root_does(comm, [&] {
    const std::string path = (fs::path(dir) / ".lock").string();
    std::error_code ec;
    fs::create_directories(dir, ec);
    FSDPP_REQUIRE(!ec, "cannot create checkpoint.dir '{}': {}", dir, ec.message());
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    FSDPP_REQUIRE(fd >= 0, "cannot open {} to lock checkpoint.dir: {}; checkpoint.dir must be writable", path,
                  std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int why = errno;
      if (why == EWOULDBLOCK) {
        const std::string holder = holder_of(fd);
        ::close(fd);
        throw UsageError(fmt::format("checkpoint.dir '{}' is in use by another run ({}, per {}); two runs saving "
                                     "into one folder corrupt each other's checkpoints: wait for that run to end or "
                                     "stop it, or give this run another checkpoint.dir", dir, holder, path));
      }
      ::close(fd);
      if (why == ENOLCK || why == EOPNOTSUPP || why == ENOSYS || why == EINVAL) {
        Log::warn("checkpoint.dir '{}': the file system does not support flock ({}); a second run saving into this "
                  "folder will not be detected", dir, std::strerror(why));
        return;
      }
      throw UsageError(fmt::format("cannot lock {}: {}", path, std::strerror(why)));
    }
    const std::string me = identity();
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
      Log::warn("could not write this run's host and PID into {}: {}", path, std::strerror(errno));
    fd_ = fd;
    remove_stale_partials(dir);
  });
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd_ < 0) return;
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace fsdpp
