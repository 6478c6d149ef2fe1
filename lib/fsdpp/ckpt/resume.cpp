#include "fsdpp/ckpt/resume.hpp"

#include "fsdpp/ckpt/directory.hpp"
#include "fsdpp/ckpt/layout.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <filesystem>

namespace fsdpp {
namespace fs = std::filesystem;
namespace {

// Why `path` cannot be resumed from ("" when it can): its layout problems, joined.
std::string unusable(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "the file does not exist";
  try {
    const LayoutCheck check = check_checkpoint_layout(path);
    std::string why;
    for (const auto& p : check.problems) why += (why.empty() ? "" : "; ") + p;
    return why;
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

ResumeChoice choose_resume_serial(const std::string& dir, ResumeMode mode, const std::string& resume_path) {
  ResumeChoice choice;
  if (mode == ResumeMode::off) return choice;
  if (mode == ResumeMode::path) {
    const std::string why = unusable(resume_path);
    FSDPP_REQUIRE(why.empty(), "checkpoint.resume: cannot resume from '{}': {}; name another checkpoint file", resume_path,
                  why);
    choice.path = resume_path;
    return choice;
  }
  const std::string key = mode == ResumeMode::automatic ? "checkpoint.resume auto" : "checkpoint.resume true";
  const LatestHint hint = read_latest(dir);
  const std::vector<CheckpointFile> files = list_checkpoints(dir);
  std::string note;  // why `latest` was not followed
  if (hint.name) {
    const std::string named = (fs::path(dir) / *hint.name).string();
    const std::string why = unusable(named);
    if (why.empty()) {
      choice.path = named;
      const auto step = step_of_checkpoint_name(*hint.name);
      for (const CheckpointFile& f : files)
        if (step && f.step > *step)
          choice.log = fmt::format("note: '{}' also holds {}, newer than {} that 'latest' names; resuming from "
                                   "what 'latest' names", dir, f.name, *hint.name);
      return choice;
    }
    note = fmt::format("'latest' names {}, which cannot be used ({})", *hint.name, why);
  } else {
    note = fmt::format("'{}' {}", (fs::path(dir) / "latest").string(), hint.problem);
  }
  if (files.empty()) {
    FSDPP_REQUIRE(mode == ResumeMode::automatic,
                  "checkpoint.resume is true but '{}' holds no checkpoint (no step_<N>.h5 files; {}); use resume: auto "
                  "to start fresh when there is none, or set checkpoint.dir to the folder that holds them", dir, note);
    choice.log = fmt::format("{}: no checkpoint in '{}' (no step_<N>.h5 files); starting fresh", key, dir);
    return choice;
  }
  std::string rejected;
  for (auto f = files.rbegin(); f != files.rend(); ++f) {
    const std::string why = unusable(f->path);
    if (why.empty()) {
      choice.path = f->path;
      choice.log = fmt::format("{}: {}; scanned '{}' and resuming from the newest valid checkpoint, {}{}", key, note,
                               dir, f->name, rejected.empty() ? "" : "; skipped (damaged):" + rejected);
      return choice;
    }
    rejected += fmt::format("\n  {}: {}", f->name, why);
  }
  throw UsageError(fmt::format("{}: '{}' holds {} checkpoint(s) but none can be resumed from ({}):{}\nnothing was "
                               "loaded or deleted; repair or move these files, or set checkpoint.dir to another folder "
                               "to start fresh", key, dir, files.size(), note, rejected));
}

ResumeChoice choose_resume(MPI_Comm comm, const std::string& dir, ResumeMode mode, const std::string& resume_path) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  ResumeChoice choice;
  root_does(comm, [&] { choice = choose_resume_serial(dir, mode, resume_path); });
  const std::string path = broadcast_string(comm, choice.path ? "+" + *choice.path : std::string());
  choice.path = path.empty() ? std::nullopt : std::optional<std::string>(path.substr(1));
  choice.log = broadcast_string(comm, choice.log);
  return choice;
}

std::string resume_past_end_note(const std::string& path, std::int64_t step, std::int64_t train_steps) {
  if (step < train_steps) return {};
  return fmt::format("{} is at step {}, {} train.steps ({}): there is nothing left to train, so this run trains 0 "
                     "steps and saves nothing; raise train.steps to train further", path, step,
                     step == train_steps ? "which is" : "past", train_steps);
}

}  // namespace fsdpp
