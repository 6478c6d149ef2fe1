#pragma once
// Output that appears whole or not at all: a file or folder written under "<path>.partial", renamed onto <path> by
// commit() after an fsync of what was written, then the parent folder fsynced (so the rename survives a power
// loss), and removed if the writer stops before that (an error, an exception). A crash leaves only the .partial,
// which the next writer of the same path removes first. Every error names the path and the reason.
// Used by checkpoints (ckpt/: Hugging Face exports, converted weights) and the tokenizer's corpus files (data/).
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
  void commit();  // fsync, rename onto the final path, fsync of its folder; Error naming the path and the reason

 private:
  std::string path_, staging_;
  Kind kind_;
  bool committed_ = false;
};

// Writes `text` to the file `path` through a StagedOutput: a reader sees all of it or the file as it was.
void write_file_whole(const std::string& path, const std::string& text);

// fsync of a file or folder by path; throws Error with the path and the reason.
void fsync_path(const std::string& path);

}  // namespace fsdpp
