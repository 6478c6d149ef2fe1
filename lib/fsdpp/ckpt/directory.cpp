#include "fsdpp/ckpt/directory.hpp"

#include "fsdpp/ckpt/save_faults.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/staged_output.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace fsdpp {
namespace fs = std::filesystem;

std::optional<std::int64_t> step_of_checkpoint_name(const std::string& name) {
  constexpr std::size_t prefix = 5, suffix = 3;  // "step_", ".h5"
  if (name.size() <= prefix + suffix || name.rfind("step_", 0) != 0 || name.compare(name.size() - suffix, suffix, ".h5") != 0)
    return std::nullopt;
  const std::string digits = name.substr(prefix, name.size() - prefix - suffix);
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return std::nullopt;
  return std::stoll(digits);
}

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointFile> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (const auto step = step_of_checkpoint_name(name)) out.push_back({name, it->path().string(), *step});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return a.step != b.step ? a.step < b.step : a.name < b.name;
  });
  return out;
}

LatestHint read_latest(const std::string& dir) {
  LatestHint hint;
  const std::string path = (fs::path(dir) / "latest").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    hint.problem = errno == ENOENT ? "is missing" : fmt::format("is unreadable ({})", std::strerror(errno));
    return hint;
  }
  std::string text(256, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  if (text.empty()) {
    hint.problem = "is empty";
    return hint;
  }
  if (!step_of_checkpoint_name(text)) {
    std::string shown;
    for (char c : text.substr(0, 40)) shown += std::isprint(static_cast<unsigned char>(c)) ? std::string(1, c) : "?";
    hint.problem = fmt::format("does not name a step_<N>.h5 file (it holds '{}')", shown);
    return hint;
  }
  hint.name = text;
  return hint;
}

void write_latest(const std::string& dir, const std::string& name) {
  const std::string latest = (fs::path(dir) / "latest").string(), temporary = latest + ".tmp";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw Error(fmt::format("cannot create {}: {}", temporary, std::strerror(errno)));
  const std::string text = name + "\n";
  int injected = fault_at(SavePoint::latest);
  const ssize_t n = injected ? -1 : ::write(fd, text.data(), text.size());
  int why = injected ? injected : errno;
  bool ok = n == static_cast<ssize_t>(text.size());
  if (ok && ::fsync(fd) != 0) ok = false, why = errno;
  if (::close(fd) != 0 && ok) ok = false, why = errno;
  if (!ok) {
    ::unlink(temporary.c_str());
    throw Error(fmt::format("cannot write {}: {}{}", temporary, std::strerror(why),
                            n >= 0 && n < static_cast<ssize_t>(text.size()) ? " (short write)" : ""));
  }
  if (::rename(temporary.c_str(), latest.c_str()) != 0) {
    why = errno;
    ::unlink(temporary.c_str());
    throw Error(fmt::format("cannot rename {} to {}: {}", temporary, latest, std::strerror(why)));
  }
  fsync_path(dir);
}

Retention apply_retention(const std::string& dir, const std::string& current, int keep_last) {
  Retention r;
  const auto current_step = step_of_checkpoint_name(current);
  if (keep_last <= 0 || !current_step) return r;
  std::vector<CheckpointFile> older;
  for (const CheckpointFile& f : list_checkpoints(dir))
    if (f.step < *current_step) older.push_back(f);
  // `current` is one of the keep_last; the newest keep_last - 1 older ones stay too.
  const std::size_t keep_older = static_cast<std::size_t>(keep_last - 1);
  for (std::size_t i = 0; i + keep_older < older.size(); ++i) {
    std::error_code ec;
    fs::remove(older[i].path, ec);
    (ec ? r.failed : r.deleted).push_back(older[i].path + (ec ? ": " + ec.message() : ""));
  }
  return r;
}

}  // namespace fsdpp
