#pragma once
// Shared by the libFuzzer targets of tests/fuzz/ (built by clang with -fsanitize=fuzzer,address,undefined in
// build-fuzz/) and by their replay executables in the normal build (GCC; tests/fuzz/replay_main.cpp feeds them
// the seed corpus and every past crash, as the ctest fuzz_replay_<target>).
//
// The contract under test: malformed input is answered with an fsdpp error (UsageError / Error, a message that
// names the file and says what is wrong), never with a crash, an out-of-bounds access, undefined behaviour, a
// leak, or an exception of another type (std::out_of_range, YAML::Exception, nlohmann::json::exception ...).
// Anything that escapes LLVMFuzzerTestOneInput aborts the run: libFuzzer then reports it as a crash and keeps
// the input.
#include "fsdpp/runtime/error.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace fsdpp::fuzz {

// A scratch file for readers that take a path: one per process (libFuzzer's -fork/-jobs workers are
// processes), on /dev/shm when there is one so that a run does not wear a disk, removed at exit.
class ScratchFile {
 public:
  explicit ScratchFile(const std::string& extension) {
    std::error_code ec;
    const std::filesystem::path dir =
        std::filesystem::is_directory("/dev/shm", ec) ? std::filesystem::path("/dev/shm")
                                                      : std::filesystem::temp_directory_path();
    path_ = (dir / ("fsdpp_fuzz_" + std::to_string(::getpid()) + extension)).string();
  }
  ~ScratchFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const std::string& write(const std::uint8_t* data, std::size_t size) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    if (!out) {
      std::fprintf(stderr, "fuzz harness: cannot write %s\n", path_.c_str());
      std::abort();
    }
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A property the target checks on inputs that were accepted (a round trip, a bound). Its failure is a bug.
#define FSDPP_FUZZ_ASSERT(cond, ...)                                                        \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "fuzz property failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::fprintf(stderr, "  %s\n", fmt::format(__VA_ARGS__).c_str());                     \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

}  // namespace fsdpp::fuzz
