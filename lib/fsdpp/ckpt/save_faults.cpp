#include "fsdpp/ckpt/save_faults.hpp"

#include "fsdpp/runtime/error.hpp"

#include <mpi.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <vector>

namespace fsdpp {
namespace {

std::mutex g_save_fault_mutex;
std::optional<SaveFault> g_armed_save_fault;
std::atomic<int> g_saves{0};

constexpr SavePoint kPoints[] = {SavePoint::stage, SavePoint::write, SavePoint::close, SavePoint::rename,
                                 SavePoint::latest};

}  // namespace

std::string_view to_string(SavePoint point) {
  switch (point) {
    case SavePoint::stage: return "stage";
    case SavePoint::write: return "write";
    case SavePoint::close: return "close";
    case SavePoint::rename: return "rename";
    case SavePoint::latest: return "latest";
  }
  return "?";
}

void arm_save_fault(const SaveFault& fault) {
  std::lock_guard<std::mutex> lock(g_save_fault_mutex);
  g_armed_save_fault = fault;
  if (g_armed_save_fault->error == 0) g_armed_save_fault->error = ENOSPC;
  g_saves = 0;
}

void disarm_save_faults() {
  std::lock_guard<std::mutex> lock(g_save_fault_mutex);
  g_armed_save_fault.reset();
}

SaveFault parse_save_fault(const std::string& text) {
  const auto bad = [&]() {
    return UsageError(fmt::format("FSDPP_TEST_SAVE_FAULT='{}': expected <point>:<save>[:<rank>][:crash] with point "
                                  "one of stage, write, close, rename, latest (e.g. write:2:1:crash)", text));
  };
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ':');) parts.push_back(part);
  if (parts.size() < 2 || parts.size() > 4) throw bad();
  SaveFault f;
  bool known = false;
  for (SavePoint p : kPoints)
    if (parts[0] == to_string(p)) f.point = p, known = true;
  if (!known) throw bad();
  try {
    std::size_t used = 0;
    f.save = std::stoi(parts[1], &used);
    if (used != parts[1].size() || f.save < 1) throw bad();
    for (std::size_t i = 2; i < parts.size(); ++i) {
      if (parts[i] == "crash") {
        if (i + 1 != parts.size()) throw bad();
        f.crash = true;
      } else {
        f.rank = std::stoi(parts[i], &used);
        if (used != parts[i].size() || i != 2) throw bad();
      }
    }
  } catch (const std::logic_error&) {
    throw bad();
  }
  return f;
}

void begin_save() { ++g_saves; }

int fault_at(SavePoint point) {
  SaveFault f;
  {
    std::lock_guard<std::mutex> lock(g_save_fault_mutex);
    if (!g_armed_save_fault || g_armed_save_fault->point != point || g_armed_save_fault->save != g_saves.load()) return 0;
    f = *g_armed_save_fault;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (f.rank >= 0 && f.rank != rank) return 0;
  if (f.crash) {
    std::fprintf(stderr, "[rank %d] test fault: dying at save point '%s' of save %d\n", rank,
                 std::string(to_string(point)).c_str(), f.save);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 9);
  }
  return f.error;
}

}  // namespace fsdpp
