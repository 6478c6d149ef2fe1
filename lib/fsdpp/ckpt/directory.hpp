#pragma once
// The checkpoint folder: step_<N>.h5 files, the `latest` hint naming one of them, and retention.
//
// `latest` is only a hint (resume.hpp decides what to load): it is replaced atomically (written to
// latest.tmp, fsynced, renamed over latest, then the folder fsynced), so after a crash it names either the
// previous checkpoint or the new one, never a half-written name.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

struct CheckpointFile {
  std::string name, path;  // step_00000042.h5, <dir>/step_00000042.h5
  std::int64_t step = 0;
};

// The step of a checkpoint file name ("step_<digits>.h5"); nullopt for anything else (.partial, latest, ...).
std::optional<std::int64_t> step_of_checkpoint_name(const std::string& name);

// Every step_<N>.h5 in `dir`, oldest step first. Empty if the folder is missing.
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);

// What <dir>/latest says. `name` is set only when the file holds one well-formed checkpoint file name;
// otherwise `problem` says why not ("is missing", "is empty", "does not name a step_<N>.h5 file (...)").
struct LatestHint {
  std::optional<std::string> name;
  std::string problem;
};
LatestHint read_latest(const std::string& dir);

// Replaces <dir>/latest with `name` atomically and durably. Throws Error naming the path and the system's
// reason when any write, fsync, close or rename fails (<dir>/latest is then unchanged).
void write_latest(const std::string& dir, const std::string& name);

// keep_last > 0: deletes the oldest checkpoints older than `current` so that keep_last remain up to and
// including `current`. Never deletes `current` or any checkpoint of a later step (those may hold a newer
// valid state than this run, e.g. after a resume from an explicit path). Returns the files deleted; a file
// that cannot be deleted is left (and named in `failed`).
struct Retention {
  std::vector<std::string> deleted, failed;
};
Retention apply_retention(const std::string& dir, const std::string& current, int keep_last);

}  // namespace fsdpp
