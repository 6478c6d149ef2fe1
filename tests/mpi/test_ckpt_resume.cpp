// Losing nothing: which checkpoint a resume picks when `latest` is missing, empty, garbage or names a damaged
// file; retention that never deletes the newest valid checkpoint; a failed save at every point of the commit
// protocol (injected through ckpt/save_faults.hpp) reported on every rank with the path and the reason, the
// previous checkpoint kept; one writer per checkpoint folder.
#include "ckpt_fixtures.hpp"
#include "mpi_test.hpp"
#include "test_helpers.hpp"

#include "fsdpp/ckpt/async_save.hpp"
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/ckpt/dir_lock.hpp"
#include "fsdpp/ckpt/directory.hpp"
#include "fsdpp/ckpt/h5.hpp"
#include "fsdpp/ckpt/resume.hpp"
#include "fsdpp/ckpt/save_faults.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

using namespace fsdpp;
using namespace fsdpp::test;
namespace fs = std::filesystem;

namespace {

using test::contains;

// Rank 0 writes `bytes` as <dir>/latest (or removes it when `bytes` is null); every rank waits.
void set_latest(MPI_Comm comm, const std::string& dir, const char* bytes, std::size_t size) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    fs::remove(dir + "/latest");
    if (bytes) std::ofstream(dir + "/latest", std::ios::binary).write(bytes, static_cast<std::streamsize>(size));
  }
  MPI_Barrier(comm);
}

std::string resume_error(MPI_Comm comm, const std::string& dir, ResumeMode mode) {
  try {
    choose_resume(comm, dir, mode);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// Rank 0 damages a checkpoint's metadata (an edited shard offset); every rank waits.
void damage(MPI_Comm comm, const std::string& path) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    h5::Handle file = h5::open_file(path, MPI_COMM_NULL, true);
    h5::set_attr(h5::open_dataset(file, "/model/wpe.weight/shard_1", path), "offset", std::int64_t{2});
  }
  MPI_Barrier(comm);
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

MPI_TEST_CASE("resume: a missing, empty, garbage or binary latest falls back to the newest valid checkpoint", 2) {
  const std::string dir = shared_temp_dir(test_comm, "resume-scan");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 0);
  for (int step : {2, 4}) save_checkpoint(test_comm, dir, saved.contents(), progress_at(step), {});
  const std::string newest = dir + "/step_00000004.h5";
  {
    const ResumeChoice sound = choose_resume(test_comm, dir, ResumeMode::automatic);
    CHECK(sound.path == newest);
    CHECK(sound.log.empty());
  }
  const std::string binary("\x89HDF\r\n\x1a\n\0\xff", 10);
  const std::vector<std::pair<const char*, std::string>> hints = {
      {nullptr, "latest' is missing"}, {"", "latest' is empty"}, {"\n  \n", "latest' is empty"},
      {"not a checkpoint", "does not name a step_<N>.h5 file (it holds 'not a checkpoint')"},
      {binary.c_str(), "does not name a step_<N>.h5 file"},
      {"step_00000099.h5\n", "'latest' names step_00000099.h5, which cannot be used (the file does not exist)"}};
  for (const auto& hint : hints) {  // no structured binding: CAPTURE's lambda could not capture one in C++17
    const char* bytes = hint.first;
    const std::string& why = hint.second;
    CAPTURE(why);
    set_latest(test_comm, dir, bytes, bytes == binary.c_str() ? binary.size() : bytes ? std::strlen(bytes) : 0);
    for (ResumeMode mode : {ResumeMode::automatic, ResumeMode::on}) {
      const ResumeChoice choice = choose_resume(test_comm, dir, mode);
      CHECK(choice.path == newest);  // never "starting fresh" while valid checkpoints exist
      CHECK(contains(choice.log, why));
      CHECK(contains(choice.log, "resuming from the newest valid checkpoint, step_00000004.h5"));
    }
  }
  // latest names a damaged file: the scan skips it and says why.
  set_latest(test_comm, dir, "step_00000004.h5\n", 17);
  damage(test_comm, newest);
  const ResumeChoice fallback = choose_resume(test_comm, dir, ResumeMode::automatic);
  CHECK(fallback.path == dir + "/step_00000002.h5");
  CHECK(contains(fallback.log, "'latest' names step_00000004.h5, which cannot be used"));
  CHECK(contains(fallback.log, "layout_xxh64"));
  CHECK(contains(fallback.log, "skipped (damaged):\n  step_00000004.h5: "));
  // Every checkpoint damaged: an error listing each one, in both modes; nothing is deleted.
  damage(test_comm, dir + "/step_00000002.h5");
  for (ResumeMode mode : {ResumeMode::automatic, ResumeMode::on}) {
    const std::string error = resume_error(test_comm, dir, mode);
    CHECK(contains(error, "holds 2 checkpoint(s) but none can be resumed from"));
    CHECK(contains(error, "\n  step_00000004.h5: "));
    CHECK(contains(error, "\n  step_00000002.h5: "));
    CHECK(contains(error, "nothing was loaded or deleted"));
  }
  // An explicit path to a damaged file is refused, naming it.
  CHECK_THROWS_WITH_AS(choose_resume(test_comm, dir, ResumeMode::path, newest),
                       doctest::Contains(("checkpoint.resume: cannot resume from '" + newest + "'").c_str()), UsageError);
  if (test_rank == 0) CHECK(names_in(dir) == std::vector<std::string>{"latest", "step_00000002.h5", "step_00000004.h5"});
  MPI_Barrier(test_comm);
  if (test_rank == 0) fs::remove_all(dir);
}

MPI_TEST_CASE("resume: a folder without checkpoints starts fresh only with auto; true says what it holds", 2) {
  const std::string dir = shared_temp_dir(test_comm, "resume-empty");
  const ResumeChoice fresh = choose_resume(test_comm, dir, ResumeMode::automatic);
  CHECK(!fresh.path);
  CHECK(contains(fresh.log, "no checkpoint in '" + dir + "' (no step_<N>.h5 files); starting fresh"));
  std::string error = resume_error(test_comm, dir, ResumeMode::on);
  CHECK(contains(error, "checkpoint.resume is true but '" + dir + "' holds no checkpoint (no step_<N>.h5 files; '" +
                            dir + "/latest' is missing)"));
  // A `latest` left behind without its file: the message says so instead of "no 'latest' file".
  set_latest(test_comm, dir, "step_00000004.h5\n", 17);
  error = resume_error(test_comm, dir, ResumeMode::on);
  CHECK(contains(error, "'latest' names step_00000004.h5, which cannot be used (the file does not exist)"));
  CHECK(!choose_resume(test_comm, dir, ResumeMode::off).path);
  MPI_Barrier(test_comm);
  if (test_rank == 0) fs::remove_all(dir);
}

TEST_CASE("resume: the note for a resume at or past train.steps names the step and train.steps") {
  CHECK(resume_past_end_note("c/step_00000004.h5", 3, 4).empty());
  CHECK(contains(resume_past_end_note("c/step_00000004.h5", 4, 4), "is at step 4, which is train.steps (4)"));
  CHECK(contains(resume_past_end_note("c/step_00000006.h5", 6, 4), "is at step 6, past train.steps (4)"));
  CHECK(contains(resume_past_end_note("c/step_00000006.h5", 6, 4), "trains 0 steps"));
}

MPI_TEST_CASE("keep_last never deletes the newest valid checkpoint nor any newer one", 2) {
  const std::string dir = shared_temp_dir(test_comm, "retention");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 0);
  for (int step : {2, 4, 6}) save_checkpoint(test_comm, dir, saved.contents(), progress_at(step), {}, 2);
  // A run that restarted from step 0 by mistake (or from an explicit older path) saves step 3: the newer
  // checkpoints of the earlier run stay.
  save_checkpoint(test_comm, dir, saved.contents(), progress_at(3), {}, 2);
  save_checkpoint(test_comm, dir, saved.contents(), progress_at(1), {}, 1);
  if (test_rank == 0) {
    CHECK(names_in(dir) == std::vector<std::string>{"latest", "step_00000001.h5", "step_00000003.h5",
                                                    "step_00000004.h5", "step_00000006.h5"});
    // Only files named like checkpoints are ever considered.
    std::ofstream(dir + "/step_notes.txt") << "x";
    std::ofstream(dir + "/step_00000000.h5.partial") << "x";
    const Retention r = apply_retention(dir, "step_00000006.h5", 1);
    CHECK(r.deleted.size() == 3);
    CHECK(names_in(dir) == std::vector<std::string>{"latest", "step_00000000.h5.partial", "step_00000006.h5",
                                                    "step_notes.txt"});
    fs::remove_all(dir);
  }
}

TEST_CASE("latest is replaced atomically: no temporary left, the old one kept when writing fails") {
  const std::string dir = (fs::temp_directory_path() / ("fsdpp-latest-" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  write_latest(dir, "step_00000002.h5");
  CHECK(read_latest(dir).name == "step_00000002.h5");
  arm_save_fault({SavePoint::latest, 1, -1, false, 0});
  begin_save();
  CHECK_THROWS_WITH_AS(write_latest(dir, "step_00000004.h5"),
                       doctest::Contains(("cannot write " + dir + "/latest.tmp: No space left on device").c_str()), Error);
  disarm_save_faults();
  CHECK(read_latest(dir).name == "step_00000002.h5");
  CHECK(!fs::exists(dir + "/latest.tmp"));
  fs::remove_all(dir);
}

MPI_TEST_CASE("save faults: a failure at each point is reported on every rank with path and reason", 2) {
  const std::string dir = shared_temp_dir(test_comm, "faults");
  Trained saved = build(test_comm, {{"dp_shard", -1}}, 0);
  save_checkpoint(test_comm, dir, saved.contents(), progress_at(2), {});
  struct Case {
    SavePoint point;
    int rank;
    std::string path;  // the path the error must name
  };
  const std::string partial = dir + "/step_00000004.h5.partial";
  const std::vector<Case> cases = {{SavePoint::stage, 1, partial},      {SavePoint::write, 1, partial},
                                   {SavePoint::write, 0, partial},      {SavePoint::close, 1, partial},
                                   {SavePoint::close, 0, partial},      {SavePoint::rename, 0, partial},
                                   {SavePoint::latest, 0, dir + "/latest.tmp"}};
  for (const Case& c : cases) {
    CAPTURE(to_string(c.point));
    CAPTURE(c.rank);
    for (CheckpointOnError policy : {CheckpointOnError::abort, CheckpointOnError::keep_going}) {
      arm_save_fault({c.point, 1, c.rank, false, 0});
      std::string error;
      try {
        const SaveResult r = save_checkpoint(test_comm, dir, saved.contents(), progress_at(4), {}, 0, policy);
        error = r.error;
        CHECK(policy == CheckpointOnError::keep_going);
      } catch (const UsageError& e) {
        error = e.what();
        CHECK(policy == CheckpointOnError::abort);
      }
      disarm_save_faults();
      CHECK(contains(error, c.path));
      CHECK(contains(error, "No space left on device"));
      if (policy == CheckpointOnError::keep_going && test_rank == 0)
        CHECK(contains(Log::last_warning(), "training continues (checkpoint.on_error: continue); 'latest' still names " +
                                                dir + "/step_00000002.h5"));
      MPI_Barrier(test_comm);
      // The previous checkpoint stays what `latest` names, nothing half-written is left, and resume works.
      CHECK(latest_checkpoint(dir) == dir + "/step_00000002.h5");
      CHECK(!fs::exists(partial));
      CHECK(choose_resume(test_comm, dir, ResumeMode::automatic).path == dir + "/step_00000002.h5");
      MPI_Barrier(test_comm);
      if (test_rank == 0) fs::remove(dir + "/step_00000004.h5");  // complete when only `latest` failed
      MPI_Barrier(test_comm);
    }
  }
  // Asynchronous saves: the failed write surfaces at commit, on every rank.
  for (CheckpointOnError policy : {CheckpointOnError::abort, CheckpointOnError::keep_going}) {
    AsyncCheckpointer background(test_comm, policy);
    arm_save_fault({SavePoint::write, 1, 1, false, 0});
    background.start(stage_checkpoint(saved.contents(), progress_at(4), {}, test_rank), dir, 0);
    std::string error;
    try {
      const auto committed = background.wait();
      CHECK(!committed);
      error = Log::last_warning();
    } catch (const UsageError& e) {
      error = e.what();
      CHECK(policy == CheckpointOnError::abort);
    }
    disarm_save_faults();
    if (policy == CheckpointOnError::abort || test_rank == 0) CHECK(contains(error, partial + " failed: No space left on device"));
    CHECK(latest_checkpoint(dir) == dir + "/step_00000002.h5");
  }
  MPI_Barrier(test_comm);
  if (test_rank == 0) fs::remove_all(dir);
}

TEST_CASE("save faults: FSDPP_TEST_SAVE_FAULT's form, and its errors") {
  const SaveFault f = parse_save_fault("write:2:1:crash");
  CHECK(f.point == SavePoint::write);
  CHECK(f.save == 2);
  CHECK(f.rank == 1);
  CHECK(f.crash);
  const SaveFault g = parse_save_fault("latest:3");
  CHECK(g.point == SavePoint::latest);
  CHECK(g.rank == -1);
  CHECK(!g.crash);
  for (const char* bad : {"", "write", "flush:1", "write:0", "write:x", "write:1:crash:2", "write:1:2:3"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_save_fault(bad), doctest::Contains("expected <point>:<save>[:<rank>][:crash]"), UsageError);
  }
}

MPI_TEST_CASE("one writer per checkpoint folder: a second lock stops on every rank, naming host and PID", 2) {
  const std::string dir = shared_temp_dir(test_comm, "lock");
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  long long pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, test_comm);  // rank 0 holds the lock
  {
    const CheckpointDirLock first(test_comm, dir);
    MPI_CHECK(0, first.held());
    CHECK_THROWS_WITH_AS(CheckpointDirLock(test_comm, dir),
                         doctest::Contains(fmt::format("is in use by another run (host {} pid {} since", host, pid).c_str()),
                         UsageError);
    const CheckpointDirLock disabled(test_comm, dir, false);  // a run that saves nothing takes no lock
    CHECK(!disabled.held());
  }
  const CheckpointDirLock again(test_comm, dir);  // released with the first run
  MPI_CHECK(0, again.held());
  MPI_Barrier(test_comm);
  if (test_rank == 0) fs::remove_all(dir);
}
