#include "fsdpp/data/tokenize_corpus.hpp"

#include "fsdpp/data/corpus_reader.hpp"
#include "fsdpp/data/token_file.hpp"
#include "fsdpp/data/tokenizer.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"
#include "fsdpp/runtime/staged_output.hpp"
#include "fsdpp/runtime/timers.hpp"

#include <glob.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

namespace fsdpp {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr std::size_t kFlushTokens = std::size_t{1} << 20;
// Test hook: a rank that has completed this many shards in this run is killed (SIGKILL) partway into the next one.
constexpr const char* kKillHook = "FSDPP_TOKENIZE_KILL_AFTER_SHARDS";

std::string shard_name(std::size_t unit) { return fmt::format("shard-{:05}.bin", unit); }
std::string record_name(std::size_t unit) { return fmt::format("shard-{:05}.json", unit); }

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// What decides the output: inputs (with their sizes), tokenizer, the document rules and the cuts. --on-bad is
// not part of it, so a run stopped by bad input can be resumed with --on-bad skip.
Json manifest_of(const CorpusOptions& options, const std::vector<std::string>& inputs, const CorpusIndex& header) {
  Json files = Json::array();
  for (const std::string& path : inputs) {
    std::error_code ec;
    files.push_back({{"path", path}, {"bytes", fs::file_size(path, ec)}});
  }
  return {{"inputs", files},          {"tokenizer", header.tokenizer}, {"eot_id", header.eot_id},
          {"bos_id", header.bos_id},  {"field", options.field},        {"split_on", options.split_on},
          {"shard_bytes", options.shard_bytes}};
}

// Rank 0: makes the folder, or checks that the one there was written by the same command.
void claim_folder(const std::string& folder, const Json& manifest) {
  const fs::path path = fs::path(folder) / kCorpusManifestName;
  std::error_code ec;
  if (fs::exists(path, ec)) {
    Json before;
    try {
      before = Json::parse(read_text_file(path));
    } catch (const Json::parse_error&) {
      throw UsageError(fmt::format("{}: not valid JSON; remove the folder {} and tokenize again", path.string(),
                                   folder));
    }
    std::vector<std::string> differ;
    for (const auto& item : manifest.items())
      if (!before.contains(item.key()) || before[item.key()] != item.value())
        differ.push_back(item.key() == "inputs" ? "inputs (the files or their sizes)"
                                                : fmt::format("{} (was {}, now {})", item.key(),
                                                              before.value(item.key(), Json()).dump(),
                                                              item.value().dump()));
    if (!differ.empty())
      throw UsageError(fmt::format("{}: was written by another tokenize command: its {} differ; write to a new "
                                   "folder, or rerun the original command to finish it",
                                   folder, fmt::join(differ, ", ")));
    return;
  }
  if (fs::exists(folder, ec) && !fs::is_empty(folder, ec))
    throw UsageError(fmt::format("{}: exists and is not a corpus folder of fsdpp tokenize (it has no {}); choose a "
                                 "new or empty folder",
                                 folder, kCorpusManifestName));
  fs::create_directories(folder, ec);
  FSDPP_REQUIRE(!ec, "{}: cannot create the output folder: {}", folder, ec.message());
  write_file_whole(path.string(), manifest.dump(1) + "\n");
}

// The record of a unit written completely by an earlier run, if there is one (its shard has the size it says).
bool completed_earlier(const fs::path& folder, std::size_t unit, int token_bytes, CorpusShard& shard) {
  std::error_code ec;
  const fs::path record = folder / record_name(unit), tokens = folder / shard_name(unit);
  if (!fs::is_regular_file(record, ec) || !fs::is_regular_file(tokens, ec)) return false;
  try {
    shard = corpus_shard_from_json_text(read_text_file(record), record.string());
  } catch (const UsageError&) {
    return false;
  }
  const std::uint64_t want = kGpt2HeaderInts * 4 + static_cast<std::uint64_t>(shard.tokens) * token_bytes;
  return shard.path == shard_name(unit) && fs::file_size(tokens, ec) == want;
}

// A shard being written: tokens buffered, then appended to a temporary file; the header is written last.
class ShardWriter {
 public:
  ShardWriter(fs::path path, int token_bytes) : path_(std::move(path)), temporary_(path_.string() + ".tmp"),
                                                token_bytes_(token_bytes) {
    errno = 0;
    file_.reset(std::fopen(temporary_.c_str(), "wb"));
    FSDPP_REQUIRE(file_ != nullptr, "{}: cannot write: {}", temporary_.string(), std::strerror(errno));
    write(gpt2_header(0, token_bytes_));
  }
  std::vector<std::uint32_t>& ids() { return ids_; }
  void flush_if_full() {
    if (ids_.size() >= kFlushTokens) flush();
  }
  void flush() {
    bytes_.clear();
    append_token_bytes(bytes_, ids_, token_bytes_);
    write(bytes_);
    count_ += ids_.size();
    ids_.clear();
    std::fflush(file_.get());
  }
  std::int64_t finish() {
    flush();
    FSDPP_REQUIRE(count_ <= 0x7FFFFFFF, "{}: {} tokens exceed the .bin header's int32 count; lower --shard-bytes or "
                  "split the input into smaller files", path_.string(), count_);
    FSDPP_REQUIRE(std::fseek(file_.get(), 0, SEEK_SET) == 0, "{}: cannot seek", temporary_.string());
    write(gpt2_header(count_, token_bytes_));
    FSDPP_REQUIRE(std::fclose(file_.release()) == 0, "{}: write failed: {}", temporary_.string(), std::strerror(errno));
    std::error_code ec;
    fs::rename(temporary_, path_, ec);
    FSDPP_REQUIRE(!ec, "{}: cannot rename into place: {}", path_.string(), ec.message());
    return static_cast<std::int64_t>(count_);
  }

 private:
  void write(const std::vector<unsigned char>& bytes) {
    errno = 0;
    FSDPP_REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), file_.get()) == bytes.size(), "{}: write failed: {}",
                  temporary_.string(), std::strerror(errno));
  }
  fs::path path_, temporary_;
  int token_bytes_;
  File file_;
  std::vector<std::uint32_t> ids_;
  std::vector<unsigned char> bytes_;
  std::uint64_t count_ = 0;
};

// The ids of a whole document, a chunk at a time where it is large (chunks end at next_chunk_boundary, so the
// ids are those of the whole text; the rest of the document is each chunk's lookahead).
void encode_document(Tokenizer& tokenizer, std::string_view document, std::size_t chunk_bytes,
                     std::vector<std::uint32_t>& out) {
  for (std::size_t at = 0; at < document.size();) {
    const std::string_view rest = document.substr(at);
    const std::size_t cut = rest.size() <= chunk_bytes ? rest.size() : next_chunk_boundary(rest, chunk_bytes);
    tokenizer.encode(rest, cut, at == 0, out);
    at += cut;
  }
}

struct Job {
  const CorpusOptions& options;
  const std::vector<CorpusUnit>& units;
  fs::path folder;
  CorpusIndex header;  // tokenizer, vocabulary, eot, bos, token width
  Tokenizer& tokenizer;
  int completed_here = 0;  // shards this rank completed in this run (for the test hook)
  int kill_after = -1;

  // Tokenizes unit `u` into its shard and record; returns the record.
  CorpusShard run_unit(std::size_t u) {
    const CorpusUnit& unit = units[u];
    CorpusShard shard;
    shard.path = shard_name(u);
    shard.source = unit.path;
    shard.byte_begin = unit.byte_begin;
    shard.byte_end = unit.byte_end;
    ShardWriter writer(folder / shard.path, header.token_bytes);
    const DocumentOptions reading{options.field, options.split_on};
    shard.empty_documents = read_unit_documents(
        unit, reading,
        [&](std::string_view document) {
          auto& ids = writer.ids();
          if (header.bos_id >= 0) ids.push_back(static_cast<std::uint32_t>(header.bos_id));
          encode_document(tokenizer, document, options.chunk_bytes, ids);
          ids.push_back(static_cast<std::uint32_t>(header.eot_id));
          ++shard.documents;
          shard.bytes += static_cast<std::int64_t>(document.size());
          if (kill_after >= 0 && completed_here >= kill_after) {  // a crash partway into a shard
            writer.flush();
            std::raise(SIGKILL);
          }
          writer.flush_if_full();
        },
        [&](const BadDocument& bad) {
          if (!options.skip_bad)
            throw UsageError(fmt::format("{}: {} ({}); fix the input, or pass --on-bad skip to leave such documents "
                                         "out (they are counted in the summary and in index.json)",
                                         bad.where, bad.what, to_string(bad.reason)));
          count(shard.skipped, bad.reason);
        });
    shard.tokens = writer.finish();
    write_file_whole((folder / record_name(u)).string(), to_json_text(shard) + "\n");
    ++completed_here;
    return shard;
  }
};

// Tokenizer, vocabulary and separators: the index's header fields.
CorpusIndex corpus_header(const Tokenizer& tokenizer, const CorpusOptions& options) {
  CorpusIndex header;
  header.tokenizer = tokenizer.describe();
  header.vocab_size = tokenizer.vocab_size();
  if (options.eot_id >= 0) {
    header.eot_id = options.eot_id;
  } else if (auto eot = tokenizer.end_of_text_id()) {
    header.eot_id = *eot;
  } else {
    throw UsageError(fmt::format("{} has no end-of-text token to end each document with; pass --eot-id N (with the "
                                 "byte-level tokenizer, e.g. --eot-id 256: the vocabulary grows to hold it)",
                                 header.tokenizer));
  }
  header.vocab_size = std::max(header.vocab_size, header.eot_id + 1);
  if (auto bos = tokenizer.bos_id()) header.bos_id = *bos;
  header.token_bytes = token_bytes_for(options.output_dir, TokenFormat::gpt2_bin, header.vocab_size);
  return header;
}

void report_progress(std::int64_t text_bytes, std::uint64_t input_done, std::uint64_t input_total, double seconds) {
  const double rate = input_done / std::max(seconds, 1e-9);
  Log::info("tokenize: {:.1f} of {:.1f} MB of input ({:.0f}%), {:.1f} MB/s of text, ETA {:.0f} s", input_done / 1e6,
            input_total / 1e6, 100.0 * input_done / std::max<std::uint64_t>(input_total, 1),
            text_bytes / 1e6 / std::max(seconds, 1e-9), (input_total - input_done) / std::max(rate, 1e-9));
}

}  // namespace

std::string unescape_separator(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    switch (const char c = text[++i]) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      default: out += '\\'; out += c;  // not an escape: kept as written
    }
  }
  return out;
}

std::vector<std::string> expand_corpus_inputs(const std::vector<std::string>& patterns, const std::string& files_from) {
  std::vector<std::string> paths;
  for (const std::string& pattern : patterns) {
    if (pattern.find_first_of("*?[") == std::string::npos) {
      paths.push_back(pattern);
      continue;
    }
    glob_t matches{};
    const int status = ::glob(pattern.c_str(), 0, nullptr, &matches);  // sorted, as the C library sorts names
    for (std::size_t i = 0; status == 0 && i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
    globfree(&matches);
    FSDPP_REQUIRE(status == 0, "{}: no input matches this pattern", pattern);
  }
  if (!files_from.empty()) {
    std::ifstream list(files_from);
    FSDPP_REQUIRE(list.good(), "{}: cannot read the --files-from list", files_from);
    for (std::string line; std::getline(list, line);)
      if (!line.empty() && line[0] != '#') paths.push_back(line);
  }
  FSDPP_REQUIRE(!paths.empty(), "no inputs: name files, glob patterns or --files-from LIST before the output folder");
  return paths;
}

CorpusSummary tokenize_corpus(MPI_Comm comm, const CorpusOptions& options) {
  const auto t0 = Clock::now();
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::string> inputs;
  std::vector<CorpusUnit> units;
  CorpusIndex header;
  Json manifest;
  every_rank_does(comm, [&] {
    tokenizer = options.tokenizer_path.empty() ? byte_level_tokenizer() : load_tokenizer(options.tokenizer_path);
    header = corpus_header(*tokenizer, options);
    inputs = expand_corpus_inputs(options.inputs, options.files_from);
    units = plan_corpus_units(inputs, options.shard_bytes, options.split_on);
    manifest = manifest_of(options, inputs, header);
  });
  root_does(comm, [&] { claim_folder(options.output_dir, manifest); });
  Job job{options, units, options.output_dir, header, *tokenizer};
  if (const char* hook = std::getenv(kKillHook)) job.kill_after = std::atoi(hook);
  std::uint64_t input_total = 0, input_done = 0;
  for (const CorpusUnit& u : units) input_total += u.byte_end - u.byte_begin;
  CorpusSummary summary;
  std::int64_t reused = 0, text_bytes = 0;
  auto last_report = Clock::now();
  for (std::size_t round = 0; round * ranks < units.size(); ++round) {
    const std::size_t u = round * ranks + rank;
    std::uint64_t input_bytes = 0;
    every_rank_does(comm, [&] {
      if (u >= units.size()) return;
      CorpusShard shard;
      if (completed_earlier(job.folder, u, header.token_bytes, shard)) {
        ++reused;
      } else {
        shard = job.run_unit(u);
        text_bytes += shard.bytes;
      }
      input_bytes = units[u].byte_end - units[u].byte_begin;
    });
    // Input done (for the ETA) and text tokenized by every rank so far (for MB/s), summed for rank 0's line.
    const std::uint64_t mine[2] = {input_bytes, static_cast<std::uint64_t>(text_bytes)};
    std::uint64_t all[2] = {0, 0};
    FSDPP_MPI_CHECK(MPI_Allreduce(mine, all, 2, MPI_UINT64_T, MPI_SUM, comm));
    input_done += all[0];
    if (rank == 0 && options.progress_seconds > 0 && seconds_since(last_report) >= options.progress_seconds) {
      last_report = Clock::now();
      report_progress(static_cast<std::int64_t>(all[1]), input_done, input_total, seconds_since(t0));
    }
  }
  root_does(comm, [&] {
    CorpusIndex index = header;
    for (std::size_t u = 0; u < units.size(); ++u) {
      const fs::path record = job.folder / record_name(u);
      index.shards.push_back(corpus_shard_from_json_text(read_text_file(record), record.string()));
    }
    write_corpus_index(options.output_dir, index);
  });
  every_rank_does(comm, [&] { summary.index = read_corpus_index(options.output_dir); });
  FSDPP_MPI_CHECK(MPI_Allreduce(&text_bytes, &summary.text_bytes, 1, MPI_INT64_T, MPI_SUM, comm));
  FSDPP_MPI_CHECK(MPI_Allreduce(&reused, &summary.reused_shards, 1, MPI_INT64_T, MPI_SUM, comm));
  const double seconds = seconds_since(t0);
  FSDPP_MPI_CHECK(MPI_Allreduce(&seconds, &summary.seconds, 1, MPI_DOUBLE, MPI_MAX, comm));
  return summary;
}

}  // namespace fsdpp
