#include "fsdpp/data/corpus_reader.hpp"

#include "fsdpp/data/token_file.hpp"
#include "fsdpp/data/utf8.hpp"
#include "fsdpp/runtime/error.hpp"

#include <simdjson.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

namespace fsdpp {
namespace {

constexpr std::size_t kReadBytes = std::size_t{1} << 20;
constexpr std::size_t kScanBytes = std::size_t{1} << 16;

bool name_ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

File open_input(const std::string& path) {
  errno = 0;
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) throw UsageError(fmt::format("{}: cannot open the input: {}", path, std::strerror(errno)));
  return f;
}

// The line number (from 1) of byte `offset` of the file: counted only when an error is reported.
std::uint64_t line_at(const std::string& path, std::uint64_t offset) {
  File f = open_input(path);
  std::string block(kReadBytes, '\0');
  std::uint64_t line = 1;
  for (std::uint64_t at = 0; at < offset;) {
    const std::size_t got = read_file_at(f.get(), path, at, block.data(), std::min<std::uint64_t>(kReadBytes, offset - at));
    if (got == 0) break;
    line += static_cast<std::uint64_t>(std::count(block.data(), block.data() + got, '\n'));
    at += got;
  }
  return line;
}

// The end of the first occurrence of `separator` (a line end for JSON Lines) that ends at or after `nominal`,
// where the next unit begins; the file size when there is none.
std::uint64_t cut_after(std::FILE* f, const std::string& path, std::uint64_t size, std::uint64_t nominal,
                        std::string_view separator) {
  if (nominal >= size) return size;
  const std::uint64_t base = nominal >= separator.size() ? nominal - separator.size() + 1 : 0;
  std::string window;
  for (std::uint64_t at = base; at < size;) {
    const std::size_t keep = std::min(window.size(), separator.size() - 1);  // a separator across two reads
    window.erase(0, window.size() - keep);
    const std::size_t have = window.size();
    window.resize(have + kScanBytes);
    const std::size_t got = read_file_at(f, path, at, window.data() + have, kScanBytes);
    window.resize(have + got);
    const std::size_t found = window.find(separator);
    if (found != std::string::npos) return at - have + found + separator.size();
    if (got == 0) break;
    at += got;
  }
  return size;
}

// Bytes of a unit: a file's byte range, or a compressed file's decompressed content.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual std::size_t read(char* dst, std::size_t n) = 0;  // 0: the end
  // Where the source is, for messages about what it ends in: "" or ", compressed byte N".
  virtual std::string position() const { return ""; }
  // After read() returned 0: why the input ended too early, or "".
  virtual std::string truncation() const { return ""; }
};

class FileRange final : public ByteSource {
 public:
  explicit FileRange(const CorpusUnit& unit) : file_(open_input(unit.path)), unit_(unit), at_(unit.byte_begin) {}
  std::size_t read(char* dst, std::size_t n) override {
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, unit_.byte_end - at_));
    const std::size_t got = n ? read_file_at(file_.get(), unit_.path, at_, dst, n) : 0;
    at_ += got;
    return got;
  }

 private:
  File file_;
  const CorpusUnit& unit_;
  std::uint64_t at_;
};

struct DctxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

class ZstdFile final : public ByteSource {
 public:
  explicit ZstdFile(const CorpusUnit& unit)
      : file_(open_input(unit.path)), path_(unit.path), dctx_(ZSTD_createDCtx()), in_(ZSTD_DStreamInSize(), '\0') {
    FSDPP_REQUIRE(dctx_ != nullptr, "{}: cannot create a zstd decompression context", path_);
  }
  std::size_t read(char* dst, std::size_t n) override {
    ZSTD_outBuffer out{dst, n, 0};
    while (out.pos == 0 && truncation_.empty()) {
      if (input_.pos == input_.size) {
        errno = 0;
        input_ = {in_.data(), std::fread(in_.data(), 1, in_.size(), file_.get()), 0};
        if (input_.size == 0 && std::ferror(file_.get()))
          throw UsageError(fmt::format("{}: read failed: {}", path_, std::strerror(errno)));
        if (input_.size == 0) {  // the file's end: inside a frame unless the last call finished one
          if (pending_ != 0) truncation_ = "the file ends inside a zstd frame (truncated)";
          break;
        }
      }
      const std::size_t was = input_.pos;
      pending_ = ZSTD_decompressStream(dctx_.get(), &out, &input_);
      consumed_ += input_.pos - was;
      if (ZSTD_isError(pending_)) truncation_ = fmt::format("zstd cannot decode it: {}", ZSTD_getErrorName(pending_));
    }
    return out.pos;
  }
  std::string position() const override { return fmt::format(", compressed byte {}", consumed_); }
  std::string truncation() const override { return truncation_; }

 private:
  File file_;
  std::string path_;
  std::unique_ptr<ZSTD_DCtx, DctxFree> dctx_;
  std::string in_;
  ZSTD_inBuffer input_{nullptr, 0, 0};
  std::size_t pending_ = 0;  // ZSTD_decompressStream's last answer: 0 once a frame is complete
  std::uint64_t consumed_ = 0;
  std::string truncation_;
};

std::unique_ptr<ByteSource> open_source(const CorpusUnit& unit) {
  if (unit.kind == InputKind::json_lines_zst) return std::make_unique<ZstdFile>(unit);
  return std::make_unique<FileRange>(unit);
}

// The string at `field` (dots go into nested objects) of the JSON text `line`, or a BadDocument.
bool document_of_line(simdjson::dom::parser& parser, std::string_view line, const std::string& field,
                      std::string_view& text, BadDocument& bad) {
  simdjson::dom::element element;
  const auto error = parser.parse(line.data(), line.size()).get(element);
  if (error) {
    bad.reason = error == simdjson::UTF8_ERROR ? BadReason::invalid_utf8 : BadReason::malformed_json;
    bad.what = fmt::format("the line is not {}: {}", error == simdjson::UTF8_ERROR ? "UTF-8" : "JSON",
                           simdjson::error_message(error));
    return false;
  }
  bad.reason = BadReason::missing_field;
  for (std::size_t begin = 0;;) {
    const std::size_t dot = std::min(field.find('.', begin), field.size());
    const std::string_view key = std::string_view(field).substr(begin, dot - begin);
    if (!element.is_object() || element.get_object().at_key(key).get(element)) {
      bad.what = fmt::format("the object has no field \"{}\" (set the field with --field)", field);
      return false;
    }
    if (dot == field.size()) break;
    begin = dot + 1;
  }
  if (element.get_string().get(text)) {
    bad.what = fmt::format("the field \"{}\" is not a string", field);
    return false;
  }
  return true;
}

// Reads the lines of a JSON Lines unit; `first_line` is that of the unit's first byte, counted lazily.
void read_json_lines(const CorpusUnit& unit, const DocumentOptions& options,
                     const std::function<void(std::string_view)>& on_document,
                     const std::function<void(const BadDocument&)>& on_bad) {
  const std::unique_ptr<ByteSource> source = open_source(unit);
  simdjson::dom::parser parser;
  std::string buffer;
  std::size_t start = 0;       // of the next line in buffer
  std::uint64_t line = 0;      // lines of the unit read so far
  auto where = [&] {
    const std::uint64_t first = unit.byte_begin == 0 ? 1 : line_at(unit.path, unit.byte_begin);
    return fmt::format("{}:{}{}", unit.path, first + line - 1, source->position());
  };
  for (bool end = false; !end;) {
    buffer.erase(0, start);
    start = 0;
    const std::size_t have = buffer.size();
    buffer.resize(have + kReadBytes);
    const std::size_t got = source->read(buffer.data() + have, kReadBytes);
    buffer.resize(have + got);
    end = got == 0;
    if (end && !source->truncation().empty()) {  // the partial line after the last whole one is lost
      ++line;
      on_bad({BadReason::truncated_zstd, where(), source->truncation()});
      return;
    }
    for (;;) {
      std::size_t newline = buffer.find('\n', start);
      if (newline == std::string::npos) {
        if (!end || start == buffer.size()) break;
        newline = buffer.size();  // the last line, without a newline
      }
      ++line;
      const std::string_view text_line(buffer.data() + start, newline - start);
      start = std::min(newline + 1, buffer.size());
      if (text_line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      std::string_view document;
      BadDocument bad{};
      if (!document_of_line(parser, text_line, options.field, document, bad)) {
        bad.where = where();
        on_bad(bad);
      } else if (!document.empty()) {
        on_document(document);
      }
    }
  }
}

void read_text(const CorpusUnit& unit, const DocumentOptions& options,
               const std::function<void(std::string_view)>& on_document,
               const std::function<void(const BadDocument&)>& on_bad) {
  // A unit of text is at most shard_bytes (plus a document) with a separator; without one, a whole file.
  std::string text(unit.byte_end - unit.byte_begin, '\0');
  FileRange range(unit);
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t got = range.read(text.data() + at, text.size() - at);
    FSDPP_REQUIRE(got > 0, "{}: the file became shorter while it was read", unit.path);
    at += got;
  }
  const std::string_view all(text);
  const std::string& sep = options.split_on;
  for (std::size_t begin = 0; begin < all.size();) {
    const std::size_t found = sep.empty() ? std::string_view::npos : all.find(sep, begin);
    const std::size_t end = found == std::string_view::npos ? all.size() : found;
    const std::string_view document = all.substr(begin, end - begin);
    if (!simdjson::validate_utf8(document.data(), document.size())) {
      const std::size_t bad = begin + valid_utf8_length(document);
      const std::uint64_t line = line_at(unit.path, unit.byte_begin) +
                                 static_cast<std::uint64_t>(std::count(all.begin(), all.begin() + bad, '\n'));
      on_bad({BadReason::invalid_utf8, fmt::format("{}:{}", unit.path, line),
              fmt::format("the text is not UTF-8 (byte {} of the file)", unit.byte_begin + bad)});
    } else if (!document.empty()) {
      on_document(document);
    }
    begin = end == all.size() ? end : end + sep.size();
  }
}

}  // namespace

InputKind input_kind_for_path(const std::string& path) {
  for (const char* ext : {".gz", ".bz2", ".xz", ".zip", ".lz4", ".tar"})
    if (name_ends_with(path, ext))
      throw UsageError(fmt::format("{}: {} files are not read; decompress it, or recompress it with zstd (.zst)",
                                   path, ext));
  if (name_ends_with(path, ".zst")) return InputKind::json_lines_zst;
  if (name_ends_with(path, ".jsonl") || name_ends_with(path, ".json")) return InputKind::json_lines;
  return InputKind::text;
}

std::vector<CorpusUnit> plan_corpus_units(const std::vector<std::string>& paths, std::uint64_t shard_bytes,
                                          const std::string& split_on) {
  FSDPP_REQUIRE(shard_bytes > 0, "--shard-bytes must be positive");
  std::vector<CorpusUnit> units;
  for (const std::string& path : paths) {
    const InputKind kind = input_kind_for_path(path);
    std::error_code ec;
    FSDPP_REQUIRE(std::filesystem::is_regular_file(path, ec), "{}: is not a file (a missing input?)", path);
    const std::uint64_t size = std::filesystem::file_size(path, ec);
    FSDPP_REQUIRE(!ec, "{}: cannot read the file size: {}", path, ec.message());
    const bool cuttable = kind == InputKind::json_lines || (kind == InputKind::text && !split_on.empty());
    const std::string separator = kind == InputKind::json_lines ? "\n" : split_on;
    File f = open_input(path);
    for (std::uint64_t begin = 0; begin < size || (begin == 0 && size == 0);) {
      const std::uint64_t end = cuttable ? cut_after(f.get(), path, size, begin + shard_bytes, separator) : size;
      units.push_back({path, kind, begin, end});
      if (end == begin) break;  // an empty file: one empty unit (a shard without tokens)
      begin = end;
    }
  }
  return units;
}

const char* to_string(BadReason reason) {
  switch (reason) {
    case BadReason::invalid_utf8: return "invalid_utf8";
    case BadReason::malformed_json: return "malformed_json";
    case BadReason::missing_field: return "missing_field";
    case BadReason::truncated_zstd: return "truncated_zstd";
  }
  return "?";
}

void count(SkippedDocuments& skipped, BadReason reason) {
  switch (reason) {
    case BadReason::invalid_utf8: ++skipped.invalid_utf8; break;
    case BadReason::malformed_json: ++skipped.malformed_json; break;
    case BadReason::missing_field: ++skipped.missing_field; break;
    case BadReason::truncated_zstd: ++skipped.truncated_zstd; break;
  }
}

void read_unit_documents(const CorpusUnit& unit, const DocumentOptions& options,
                         const std::function<void(std::string_view)>& on_document,
                         const std::function<void(const BadDocument&)>& on_bad) {
  if (unit.kind == InputKind::text)
    read_text(unit, options, on_document, on_bad);
  else
    read_json_lines(unit, options, on_document, on_bad);
}

}  // namespace fsdpp
