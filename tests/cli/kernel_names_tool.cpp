// A Kokkos Tools library for tests/cli/kernel_labels.sh: loaded into a real `fsdpp train` through
// KOKKOS_TOOLS_LIBS (Kokkos 4.x) or KOKKOS_PROFILE_LIBRARY (Kokkos 3.4), it records the name of every
// parallel_for / parallel_reduce / parallel_scan the process launches and, when Kokkos finalizes, writes the
// distinct names, one per line as "<kind> <name>", to $FSDPP_KERNEL_NAMES_DIR/kernels.<pid>.
// Kokkos prints an unlabelled kernel under its functor's type name, so a missing label shows up too.
// Profile regions (Kokkos::Profiling::pushRegion: fsdpp's timeline spans, observe/timeline.hpp) are recorded as
// "region <name>".
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

namespace {

std::mutex g_mutex;
std::set<std::string> g_names;  // "<kind> <name>"

void record(const char* kind, const char* name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_names.insert(std::string(kind) + " " + (name ? name : "(null)"));
}

}  // namespace

extern "C" {

void kokkosp_init_library(int, std::uint64_t, std::uint32_t, void*) {}

void kokkosp_finalize_library() {
  const char* dir = std::getenv("FSDPP_KERNEL_NAMES_DIR");
  if (!dir) return;
  const std::string path = std::string(dir) + "/kernels." + std::to_string(::getpid());
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "kernel_names_tool: cannot write %s\n", path.c_str());
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const std::string& line : g_names) std::fprintf(out, "%s\n", line.c_str());
  std::fclose(out);
}

void kokkosp_begin_parallel_for(const char* name, std::uint32_t, std::uint64_t* id) {
  record("parallel_for", name);
  *id = 0;
}
void kokkosp_end_parallel_for(std::uint64_t) {}

void kokkosp_begin_parallel_reduce(const char* name, std::uint32_t, std::uint64_t* id) {
  record("parallel_reduce", name);
  *id = 0;
}
void kokkosp_end_parallel_reduce(std::uint64_t) {}

void kokkosp_begin_parallel_scan(const char* name, std::uint32_t, std::uint64_t* id) {
  record("parallel_scan", name);
  *id = 0;
}
void kokkosp_end_parallel_scan(std::uint64_t) {}

void kokkosp_push_profile_region(const char* name) { record("region", name); }
void kokkosp_pop_profile_region() {}

}  // extern "C"
