#include "fsdpp/runtime/timers.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>

namespace fsdpp {

SectionTimers::SectionTimers(std::vector<std::string> sections)
    : names_(std::move(sections)), seconds_(names_.size(), 0.0), last_(std::chrono::steady_clock::now()) {}

void SectionTimers::mark(int section) {
  const auto now = std::chrono::steady_clock::now();
  seconds_[static_cast<std::size_t>(section)] += std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

void SectionTimers::restart() { last_ = std::chrono::steady_clock::now(); }

std::string SectionTimers::report(MPI_Comm comm, double loop_seconds) const {
  return min_avg_max_table(comm, names_, seconds_, loop_seconds);
}

std::string min_avg_max_table(MPI_Comm comm, const std::vector<std::string>& names_, std::vector<double> seconds_,
                              double loop_seconds) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int n = static_cast<int>(seconds_.size());
  std::vector<double> mins(seconds_), maxs(seconds_), sums(seconds_), squares(seconds_.size());
  for (std::size_t i = 0; i < seconds_.size(); ++i) squares[i] = seconds_[i] * seconds_[i];
  MPI_Allreduce(MPI_IN_PLACE, mins.data(), n, MPI_DOUBLE, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, maxs.data(), n, MPI_DOUBLE, MPI_MAX, comm);
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), n, MPI_DOUBLE, MPI_SUM, comm);
  MPI_Allreduce(MPI_IN_PLACE, squares.data(), n, MPI_DOUBLE, MPI_SUM, comm);
  std::string out = fmt::format("{:<10} | {:>10} | {:>10} | {:>10} | {:>7} | {:>6}\n", "Section", "min time", "avg time",
                                "max time", "%varavg", "%total");
  out += std::string(68, '-') + "\n";
  for (int i = 0; i < n; ++i) {
    const double avg = sums[i] / size;
    const double var = std::max(0.0, squares[i] / size - avg * avg);
    out += fmt::format("{:<10} | {:>10.4f} | {:>10.4f} | {:>10.4f} | {:>7.1f} | {:>6.2f}\n", names_[i], mins[i], avg,
                       maxs[i], avg > 0 ? 100.0 * std::sqrt(var) / avg : 0.0,
                       loop_seconds > 0 ? 100.0 * avg / loop_seconds : 0.0);
  }
  return out;
}

std::string min_avg_max_sum_table(MPI_Comm comm, const std::vector<std::string>& names, std::vector<double> values,
                                  const std::string& unit) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  const int n = static_cast<int>(values.size());
  std::vector<double> mins(values), maxs(values), sums(values);
  MPI_Allreduce(MPI_IN_PLACE, mins.data(), n, MPI_DOUBLE, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, maxs.data(), n, MPI_DOUBLE, MPI_MAX, comm);
  MPI_Allreduce(MPI_IN_PLACE, sums.data(), n, MPI_DOUBLE, MPI_SUM, comm);
  std::string out = fmt::format("{:<18} | {:>10} | {:>10} | {:>10} | {:>11}\n", unit, "min", "avg", "max", "total");
  out += std::string(71, '-') + "\n";
  for (int i = 0; i < n; ++i)
    out += fmt::format("{:<18} | {:>10.1f} | {:>10.1f} | {:>10.1f} | {:>11.1f}\n", names[i], mins[i], sums[i] / size,
                       maxs[i], sums[i]);
  return out;
}

std::int64_t peak_host_memory_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace fsdpp
