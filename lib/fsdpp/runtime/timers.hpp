#pragma once
// Section timers for the end-of-run breakdown, LAMMPS style: each rank accumulates wall time per section;
// the report gives min / avg / max across ranks and each section's share of the loop time.
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// Wall-clock seconds since t0, on the monotonic clock every timer of fsdpp uses.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class SectionTimers {
 public:
  explicit SectionTimers(std::vector<std::string> sections);

  // Adds the time since the previous mark (or construction) to `section`; sections of a step are marked in
  // turn, so together they account for all of it.
  void mark(int section);
  void restart();  // forget the time since the last mark (e.g. across an evaluation that is timed elsewhere)
  double seconds(int section) const { return seconds_[static_cast<std::size_t>(section)]; }

  // Collective over `comm`. "Section | min time | avg time | max time | %varavg | %total".
  std::string report(MPI_Comm comm, double loop_seconds) const;

 private:
  std::vector<std::string> names_;
  std::vector<double> seconds_;
  std::chrono::steady_clock::time_point last_;
};

// The same table for any per-rank seconds (collective over `comm`).
std::string min_avg_max_table(MPI_Comm comm, const std::vector<std::string>& names, std::vector<double> seconds,
                              double loop_seconds);

// "Quantity | min | avg | max | total" over ranks for any per-rank values, such as peak memory (collective).
std::string min_avg_max_sum_table(MPI_Comm comm, const std::vector<std::string>& names, std::vector<double> values,
                                  const std::string& unit);

// Peak resident memory of this process in bytes (getrusage), the host high-water mark.
std::int64_t peak_host_memory_bytes();

}  // namespace fsdpp
