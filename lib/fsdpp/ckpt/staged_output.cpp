#include "fsdpp/ckpt/staged_output.hpp"

#include "fsdpp/ckpt/directory.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <filesystem>

namespace fsdpp {
namespace fs = std::filesystem;

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

}  // namespace fsdpp
