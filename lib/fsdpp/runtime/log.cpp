#include "fsdpp/runtime/log.hpp"

#include <string_view>

namespace fsdpp {
namespace {
int g_rank = 0;
int g_size = 1;
LogOptions g_options;
std::FILE* g_tee = nullptr;
std::string g_last_warning;

// Each line is written with one fwrite so that lines of different ranks sharing a terminal do not interleave
// mid-line.
void write_lines(std::FILE* stream, std::string_view prefix, std::string_view text) {
  std::string out;
  out.reserve(text.size() + prefix.size() * 4 + 1);
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = text.find('\n', start);
    const std::string_view line = text.substr(start, end == std::string_view::npos ? text.npos : end - start);
    if (end == std::string_view::npos && line.empty() && start > 0) break;
    out.append(prefix);
    out.append(line);
    out.push_back('\n');
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  std::fwrite(out.data(), 1, out.size(), stream);
  std::fflush(stream);
  if (g_tee) {
    std::fwrite(out.data(), 1, out.size(), g_tee);
    std::fflush(g_tee);
  }
}
}  // namespace

void Log::configure(int rank, int size, LogOptions options) {
  g_rank = rank;
  g_size = size;
  g_options = options;
}

const LogOptions& Log::options() { return g_options; }

void Log::tee_to(const std::string& path) {
  if (g_tee) std::fclose(g_tee);
  g_tee = path.empty() ? nullptr : std::fopen(path.c_str(), "a");
}

void Log::remember_warning(std::string text) { g_last_warning = std::move(text); }
const std::string& Log::last_warning() { return g_last_warning; }

bool Log::speaks() { return g_rank == 0 || g_options.all_ranks; }

void Log::emit(std::FILE* stream, const std::string& text) {
  if (g_options.rank_prefix && g_size > 1) {
    emit_with_rank(stream, text);
  } else {
    write_lines(stream, "", text);
  }
}

void Log::emit_with_rank(std::FILE* stream, const std::string& text) {
  write_lines(stream, fmt::format("[rank {}] ", g_rank), text);
}

void Log::error_one_rank(const std::string& message) { emit_with_rank(stderr, "error: " + message); }

void Log::error_all_ranks(const std::string& message) {
  if (g_rank == 0) write_lines(stderr, "", "error: " + message);
}

}  // namespace fsdpp
