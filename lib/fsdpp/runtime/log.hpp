#pragma once
// Logging for an MPI job: by default only rank 0 speaks; on request every rank does, and every line can carry
// a "[rank r]" prefix so interleaved output stays readable.
#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace fsdpp {

struct LogOptions {
  bool all_ranks = false;    // every rank prints info lines, not only rank 0
  bool rank_prefix = false;  // prefix every line with "[rank r]"
};

class Log {
 public:
  static void configure(int rank, int size, LogOptions options);
  // Also append every line this rank prints to `path` (the run's log copy); empty path stops it.
  static void tee_to(const std::string& path);
  static const LogOptions& options();

  // An info line: printed by rank 0, or by every rank with all_ranks.
  template <class... Args> static void info(fmt::format_string<Args...> f, Args&&... args) {
    if (speaks()) emit(stdout, fmt::format(f, std::forward<Args>(args)...));
  }
  // A warning: printed like info, to stderr, prefixed "warning: ". Every rank remembers the last one.
  template <class... Args> static void warn(fmt::format_string<Args...> f, Args&&... args) {
    remember_warning(fmt::format(f, std::forward<Args>(args)...));
    if (speaks()) emit(stderr, "warning: " + last_warning());
  }
  static const std::string& last_warning();  // for tests and summaries
  // A line every rank prints, always with its rank (device maps, one-rank errors).
  template <class... Args> static void every_rank(fmt::format_string<Args...> f, Args&&... args) {
    emit_with_rank(stdout, fmt::format(f, std::forward<Args>(args)...));
  }
  static void error_one_rank(const std::string& message);  // "[rank r] error: ..." on stderr
  static void error_all_ranks(const std::string& message); // rank 0 only: "error: ..." on stderr

 private:
  static bool speaks();
  static void remember_warning(std::string text);
  static void emit(std::FILE* stream, const std::string& text);
  static void emit_with_rank(std::FILE* stream, const std::string& text);
};

}  // namespace fsdpp
