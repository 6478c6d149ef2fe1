#include "fsdpp/data/tokenize.hpp"

#include "fsdpp/data/token_file.hpp"
#include "fsdpp/data/tokenizer.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/runtime/timers.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <system_error>

namespace fsdpp {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kBoundaryScanBytes = std::size_t{1} << 20;
constexpr std::size_t kCopyBytes = std::size_t{8} << 20;
constexpr std::size_t kLookaheadBytes = 4096;  // text after a chunk that the pre-tokenizer may look at

File open_file(const std::string& path, const char* mode, const char* what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError(fmt::format("{}: is a directory, not a {} file", path, what));
  errno = 0;
  File f(std::fopen(path.c_str(), mode));
  if (!f)
    throw UsageError(fmt::format("{}: cannot {} {} file: {}", path, mode[0] == 'r' && mode[1] != '+' ? "open" : "write",
                                 what, std::strerror(errno)));
  return f;
}

void write_all(std::FILE* f, const std::string& path, const void* p, std::size_t n) {
  errno = 0;
  if (std::fwrite(p, 1, n, f) != n) throw UsageError(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
}

void close_checked(File f, const std::string& path) {
  errno = 0;
  if (std::fclose(f.release()) != 0) throw UsageError(fmt::format("{}: write failed: {}", path, std::strerror(errno)));
}

// The first chunk boundary at or after `nominal` in the file (its size when there is none): where a rank's
// byte range starts. Every rank computes every boundary it needs the same way, so the ranges tile the file.
std::uint64_t boundary_in_file(std::FILE* f, const std::string& path, std::uint64_t size, std::uint64_t nominal) {
  if (nominal == 0 || nominal >= size) return std::min(nominal, size);
  const std::uint64_t base = nominal - 1;  // the boundary test looks one byte back
  std::string window;
  for (std::size_t searched_from = 1;;) {
    const std::size_t have = window.size();
    window.resize(have + kBoundaryScanBytes);
    window.resize(have + read_file_at(f, path, base + have, window.data() + have, kBoundaryScanBytes));
    const std::size_t p = next_chunk_boundary(window, searched_from);
    if (p < window.size()) return base + p;
    if (base + window.size() >= size) return size;
    searched_from = window.size();
  }
}

// Tokenizes text[begin, end) of the input a chunk at a time, handing each chunk's ids to `sink`.
struct RangeTokenizer {
  std::FILE* in;
  const std::string& path;
  std::uint64_t size;
  const TokenizeOptions& options;
  bool report_progress;

  std::int64_t run(std::uint64_t begin, std::uint64_t end, Tokenizer& tokenizer,
                   const std::function<void(const std::vector<std::uint32_t>&)>& sink) const {
    std::string buffer;  // text from file offset `at`, and some text after the chunk for lookahead
    std::vector<std::uint32_t> ids;
    std::uint64_t at = begin;
    std::int64_t count = 0;
    const auto t0 = Clock::now();
    auto last_report = t0;
    std::size_t target = options.chunk_bytes + kLookaheadBytes;
    while (at < end) {
      if (buffer.size() < target) {
        const std::size_t have = buffer.size();
        buffer.resize(target);
        buffer.resize(have + read_file_at(in, path, at + have, buffer.data() + have, target - have));
      }
      // The range's last chunk once the buffer holds the rest and a character past it (the lookahead).
      std::size_t cut = static_cast<std::size_t>(end - at);
      if (at + buffer.size() <= end && at + buffer.size() < size) {
        cut = next_chunk_boundary(buffer, buffer.size() / 2);
        if (cut >= buffer.size()) {  // no boundary in the second half: one very long line; read more of it
          target = buffer.size() * 2;
          continue;
        }
      }
      target = options.chunk_bytes + kLookaheadBytes;
      ids.clear();
      tokenizer.encode(buffer, cut, at == 0, ids);
      sink(ids);
      count += static_cast<std::int64_t>(ids.size());
      buffer.erase(0, cut);
      at += cut;
      if (report_progress && options.progress_seconds > 0 && seconds_since(last_report) >= options.progress_seconds) {
        last_report = Clock::now();
        const double done = static_cast<double>(at - begin), total = static_cast<double>(end - begin);
        Log::info("tokenize: {:.1f} of {:.1f} MiB ({:.0f}%), {:.1f} MB/s, {} tokens so far", done / (1 << 20),
                  total / (1 << 20), 100 * done / total, done / 1e6 / seconds_since(t0), count);
      }
    }
    return count;
  }
};

std::string part_path(const std::string& out_path, int rank, int ranks) {
  return fmt::format("{}.part{}of{}", out_path, rank, ranks);
}

// Writes the final .bin header into `out_path` (rank 0, after every rank has counted): over the placeholder of a
// 1-rank run, or into a new file sized for the parts that the ranks then copy in.
void finish_output(const std::string& out_path, bool from_parts, TokenFormat format, const TokenizeSummary& summary) {
  const std::uint64_t header = format == TokenFormat::gpt2_bin ? kGpt2HeaderInts * 4 : 0;
  File out = open_file(out_path, from_parts ? "wb" : "r+b", "token");
  if (header) write_all(out.get(), out_path, gpt2_header(summary.tokens, summary.token_bytes).data(), header);
  close_checked(std::move(out), out_path);
  if (from_parts)
    std::filesystem::resize_file(out_path, header + static_cast<std::uint64_t>(summary.tokens) * summary.token_bytes);
}

// Copies a rank's part file into the output at `offset`, then removes it.
void copy_part_into(const std::string& part_path, const std::string& out_path, std::uint64_t offset) {
  File part = open_file(part_path, "rb", "token"), out = open_file(out_path, "r+b", "token");
  errno = 0;
  if (fseeko(out.get(), static_cast<off_t>(offset), SEEK_SET) != 0)
    throw UsageError(fmt::format("{}: cannot seek to byte {}: {}", out_path, offset, std::strerror(errno)));
  std::vector<char> block(kCopyBytes);
  for (std::uint64_t done = 0;;) {
    const std::size_t got = read_file_at(part.get(), part_path, done, block.data(), block.size());
    if (got == 0) break;
    write_all(out.get(), out_path, block.data(), got);
    done += got;
  }
  close_checked(std::move(out), out_path);
  part.reset();
  std::filesystem::remove(part_path);
}

}  // namespace

std::vector<std::uint32_t> byte_tokens(std::string_view text) {
  std::vector<std::uint32_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string bytes_from_tokens(const std::vector<std::uint32_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    FSDPP_REQUIRE(tokens[i] < kByteVocabSize, "token {} at position {} is not a byte (byte-level vocabulary is {})",
                  tokens[i], i, kByteVocabSize);
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return text;
}

TokenizeSummary tokenize_file(MPI_Comm comm, const std::string& text_path, const std::string& out_path,
                              const TokenizeOptions& options) {
  const auto t0 = Clock::now();
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  TokenizeSummary summary;
  std::unique_ptr<Tokenizer> tokenizer;
  File in;
  std::uint64_t begin = 0, end = 0;
  TokenFormat format{};
  // Everything that can be wrong with the arguments is found before any output is written.
  every_rank_does(comm, [&] {
    format = token_format_for_path(out_path);
    tokenizer = options.tokenizer_path.empty() ? byte_level_tokenizer() : load_tokenizer(options.tokenizer_path);
    summary.vocab_size = tokenizer->vocab_size();
    summary.token_bytes = token_bytes_for(out_path, format, summary.vocab_size);
    summary.tokenizer = tokenizer->describe();
    in = open_file(text_path, "rb", "text");
    std::error_code ec;
    const std::uint64_t size = std::filesystem::file_size(text_path, ec);
    if (ec) throw UsageError(fmt::format("{}: cannot read the file size: {}", text_path, ec.message()));
    FSDPP_REQUIRE(size > 0, "{}: the text file is empty; there is nothing to tokenize", text_path);
    summary.bytes = static_cast<std::int64_t>(size);
    begin = boundary_in_file(in.get(), text_path, size, size * rank / ranks);
    end = boundary_in_file(in.get(), text_path, size, size * (rank + 1) / ranks);
  });
  const bool wide = summary.token_bytes == 4;
  const std::uint64_t header = format == TokenFormat::gpt2_bin ? kGpt2HeaderInts * 4 : 0;
  const std::string mine = ranks == 1 ? out_path : part_path(out_path, rank, ranks);
  std::int64_t count = 0;
  auto remove_outputs = [&] {
    std::error_code ec;
    std::filesystem::remove(mine, ec);
    if (rank == 0) std::filesystem::remove(out_path, ec);
  };
  every_rank_does(
      comm,
      [&] {
        File out = open_file(mine, "wb", "token");
        if (ranks == 1 && header) write_all(out.get(), mine, gpt2_header(0, summary.token_bytes).data(), header);
        std::vector<unsigned char> bytes;
        const RangeTokenizer range{in.get(), text_path, static_cast<std::uint64_t>(summary.bytes), options, rank == 0};
        count = range.run(begin, end, *tokenizer, [&](const std::vector<std::uint32_t>& ids) {
          bytes.clear();
          append_token_bytes(bytes, ids, wide ? 4 : 2);
          write_all(out.get(), mine, bytes.data(), bytes.size());
        });
        close_checked(std::move(out), mine);
      },
      remove_outputs);
  std::vector<std::int64_t> counts(ranks);
  FSDPP_MPI_CHECK(MPI_Allgather(&count, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, comm));
  std::int64_t before = 0;
  for (int r = 0; r < ranks; ++r) (r < rank ? before : summary.tokens) += counts[r];
  summary.tokens += before;
  every_rank_does(
      comm,
      [&] {
        if (format == TokenFormat::gpt2_bin && summary.tokens > 0x7FFFFFFF)
          throw UsageError(fmt::format("{}: {} tokens exceed the .bin header's int32 count; write .u16/.u32, or "
                                       "split the text into shards",
                                       out_path, summary.tokens));
        if (rank == 0) finish_output(out_path, ranks > 1, format, summary);
      },
      remove_outputs);
  if (ranks > 1) {
    every_rank_does(
        comm,
        [&] {
          copy_part_into(mine, out_path, header + static_cast<std::uint64_t>(before) * summary.token_bytes);
        },
        remove_outputs);
  }
  summary.seconds = seconds_since(t0);
  double seconds = summary.seconds;
  FSDPP_MPI_CHECK(MPI_Allreduce(&seconds, &summary.seconds, 1, MPI_DOUBLE, MPI_MAX, comm));
  return summary;
}

std::int64_t tokenize_file(const std::string& text_path, const std::string& out_path) {
  return tokenize_file(MPI_COMM_SELF, text_path, out_path).tokens;
}

}  // namespace fsdpp
