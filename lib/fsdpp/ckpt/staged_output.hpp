#pragma once
// An output file or folder that appears whole or not at all: written under "<path>.partial", renamed onto
// <path> by commit(), and removed if the writer stops before that (an error, an exception). A crash leaves only
// the .partial, which the next writer of the same path removes first.
#include <string>

namespace fsdpp {

class StagedOutput {
 public:
  enum class Kind { file, folder };
  // Refuses an existing folder that is not empty (a file is replaced, as a save replaces it); removes a
  // .partial a crashed writer left; creates the staging folder for Kind::folder.
  StagedOutput(std::string path, Kind kind);
  ~StagedOutput();  // removes the staging path unless committed
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  const std::string& staging() const { return staging_; }  // where to write
  void commit();  // fsync, then rename onto the final path; Error naming the path and the reason on failure

 private:
  std::string path_, staging_;
  Kind kind_;
  bool committed_ = false;
};

}  // namespace fsdpp
