#pragma once
// A fresh folder per test under the system's temporary directory, removed at the end; the pid and the clock keep
// concurrent test runs apart.
#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>

namespace fsdpp::test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    const auto ticks = std::chrono::steady_clock::now().time_since_epoch().count();
    path = std::filesystem::temp_directory_path() / fmt::format("{}_{}_{}", prefix, ::getpid(), ticks);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path / name).string(); }
};

}  // namespace fsdpp::test
