#include "fsdpp/runtime/staged_output.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace fsdpp {
namespace fs = std::filesystem;

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(fmt::format("cannot open {} to fsync it: {}", path, std::strerror(errno)));
  // Some file systems cannot fsync a folder (EINVAL): nothing more can be done there.
  const bool ok = ::fsync(fd) == 0 || (errno == EINVAL && fs::is_directory(path));
  const int why = errno;
  ::close(fd);
  if (!ok) throw Error(fmt::format("fsync of {} failed: {}", path, std::strerror(why)));
}

StagedOutput::StagedOutput(std::string path, Kind kind) : path_(std::move(path)), staging_(path_ + ".partial"), kind_(kind) {
  std::error_code ec;
  if (kind_ == Kind::folder && fs::is_directory(path_, ec))
    FSDPP_REQUIRE(fs::is_empty(path_, ec), "{}: the folder exists and is not empty; write into a new folder (or "
                  "remove this one first)", path_);
  FSDPP_REQUIRE(!(kind_ == Kind::folder && fs::exists(path_, ec) && !fs::is_directory(path_, ec)),
                "{}: exists and is not a folder; name a new folder to write", path_);
  FSDPP_REQUIRE(!(kind_ == Kind::file && fs::is_directory(path_, ec)), "{}: is a folder; name a file to write", path_);
  fs::remove_all(staging_, ec);  // a crashed writer's
  if (kind_ == Kind::folder) {
    fs::create_directories(staging_, ec);
    FSDPP_REQUIRE(!ec, "{}: cannot create the folder ({}); check the path and its permissions", staging_, ec.message());
  }
}

StagedOutput::~StagedOutput() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);
}

void StagedOutput::commit() {
  if (kind_ == Kind::folder) {
    for (const auto& entry : fs::directory_iterator(staging_)) fsync_path(entry.path().string());
  }
  fsync_path(staging_);
  std::error_code ec;
  if (kind_ == Kind::folder) fs::remove(path_, ec);  // an empty folder of that name (checked above)
  fs::rename(staging_, path_, ec);
  FSDPP_CHECK(!ec, "{}: cannot rename {} onto it ({})", path_, staging_, ec.message());
  const std::string parent = fs::path(path_).parent_path().string();
  fsync_path(parent.empty() ? "." : parent);
  committed_ = true;
}

void write_file_whole(const std::string& path, const std::string& text) {
  StagedOutput staged(path, StagedOutput::Kind::file);
  std::FILE* out = std::fopen(staged.staging().c_str(), "wb");
  FSDPP_REQUIRE(out != nullptr, "{}: cannot write: {}", staged.staging(), std::strerror(errno));
  errno = 0;
  const bool written = std::fwrite(text.data(), 1, text.size(), out) == text.size();
  const int why = errno;
  const bool closed = std::fclose(out) == 0;
  FSDPP_REQUIRE(written && closed, "{}: cannot write: {}", staged.staging(),
                std::strerror(written ? errno : why));
  staged.commit();
}

}  // namespace fsdpp
