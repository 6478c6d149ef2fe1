#include "fsdpp/data/corpus_reader.hpp"

#include "fsdpp/data/token_file.hpp"
#include "fsdpp/data/utf8.hpp"
#include "fsdpp/runtime/error.hpp"

#include <bzlib.h>
#include <lzma.h>
#include <simdjson.h>
#include <zlib.h>
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

// One compression format's decoder (a library's streaming API), driven by CompressedFile, which owns the reading
// loop, the compressed byte count and the reasons a file ends too early, alike for every format.
class StreamDecoder {
 public:
  struct Step {
    std::size_t consumed = 0, produced = 0;
    std::string error;  // the library's reason when the input cannot be decoded
  };
  StreamDecoder(const char* format, const char* frame) : format(format), frame(frame) {}
  virtual ~StreamDecoder() = default;
  // Decodes from `in` into `out` as far as both allow. `input_ended`: `in` is empty and the file has no more
  // bytes, so the decoder only flushes what it holds (xz must be told, to know its last stream has ended).
  virtual Step decode(const char* in, std::size_t in_size, char* out, std::size_t out_size, bool input_ended) = 0;
  // True when the input decoded so far stops where a frame (member, stream) ends: the file may end here without
  // losing anything. Several frames one after another are one text (`cat a.gz b.gz`, bgzip, pbzip2, pzstd).
  virtual bool at_boundary() const = 0;

  const char* const format;  // for messages: "gzip"
  const char* const frame;   // what a file is a sequence of: "a gzip member"
};

struct DctxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

class ZstdDecoder final : public StreamDecoder {
 public:
  ZstdDecoder() : StreamDecoder("zstd", "a zstd frame"), dctx_(ZSTD_createDCtx()) {
    FSDPP_REQUIRE(dctx_ != nullptr, "cannot create a zstd decompression context (out of memory?)");
  }
  Step decode(const char* in, std::size_t in_size, char* out, std::size_t out_size, bool) override {
    ZSTD_inBuffer input{in, in_size, 0};
    ZSTD_outBuffer output{out, out_size, 0};
    const std::size_t hint = ZSTD_decompressStream(dctx_.get(), &output, &input);  // 0: a frame is complete
    if (ZSTD_isError(hint)) return {input.pos, output.pos, ZSTD_getErrorName(hint)};
    if (hint == 0)
      at_boundary_ = true;
    else if (input.pos > 0 || output.pos > 0)
      at_boundary_ = false;
    return {input.pos, output.pos, ""};
  }
  bool at_boundary() const override { return at_boundary_; }

 private:
  std::unique_ptr<ZSTD_DCtx, DctxFree> dctx_;
  bool at_boundary_ = true;
};

class GzipDecoder final : public StreamDecoder {
 public:
  GzipDecoder() : StreamDecoder("gzip", "a gzip member") {
    FSDPP_REQUIRE(inflateInit2(&z_, 16 + MAX_WBITS) == Z_OK, "cannot start zlib's gzip decoder (out of memory?)");
  }
  ~GzipDecoder() override { inflateEnd(&z_); }
  Step decode(const char* in, std::size_t in_size, char* out, std::size_t out_size, bool) override {
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in));
    z_.avail_in = static_cast<uInt>(in_size);
    z_.next_out = reinterpret_cast<Bytef*>(out);
    z_.avail_out = static_cast<uInt>(out_size);
    const int status = inflate(&z_, Z_NO_FLUSH);
    Step step{in_size - z_.avail_in, out_size - z_.avail_out, ""};
    if (status == Z_STREAM_END) {  // a member ends; the next one (if the file goes on) starts afresh
      at_boundary_ = true;
      inflateReset(&z_);
    } else if (status == Z_OK) {
      at_boundary_ = false;
    } else if (status != Z_BUF_ERROR) {  // Z_BUF_ERROR: no progress without more input, not an error
      step.error = z_.msg != nullptr ? z_.msg : fmt::format("zlib error {}", status);
    }
    return step;
  }
  bool at_boundary() const override { return at_boundary_; }

 private:
  z_stream z_{};
  bool at_boundary_ = true;
};

const char* bzip2_error(int status) {
  switch (status) {
    case BZ_DATA_ERROR: return "the data is corrupt (BZ_DATA_ERROR)";
    case BZ_DATA_ERROR_MAGIC: return "not bzip2 data (BZ_DATA_ERROR_MAGIC)";
    case BZ_MEM_ERROR: return "out of memory (BZ_MEM_ERROR)";
    default: return "libbz2 failed";
  }
}

class Bzip2Decoder final : public StreamDecoder {
 public:
  Bzip2Decoder() : StreamDecoder("bzip2", "a bzip2 stream") { start(); }
  ~Bzip2Decoder() override { BZ2_bzDecompressEnd(&s_); }
  Step decode(const char* in, std::size_t in_size, char* out, std::size_t out_size, bool) override {
    s_.next_in = const_cast<char*>(in);
    s_.avail_in = static_cast<unsigned>(in_size);
    s_.next_out = out;
    s_.avail_out = static_cast<unsigned>(out_size);
    const int status = BZ2_bzDecompress(&s_);
    Step step{in_size - s_.avail_in, out_size - s_.avail_out, ""};
    if (status == BZ_STREAM_END) {  // libbz2 decodes one stream: start again for the next (pbzip2 writes many)
      at_boundary_ = true;
      BZ2_bzDecompressEnd(&s_);
      start();
    } else if (status == BZ_OK) {
      if (step.consumed > 0 || step.produced > 0) at_boundary_ = false;
    } else {
      step.error = bzip2_error(status);
    }
    return step;
  }
  bool at_boundary() const override { return at_boundary_; }

 private:
  void start() {
    s_ = bz_stream{};
    FSDPP_REQUIRE(BZ2_bzDecompressInit(&s_, 0, 0) == BZ_OK, "cannot start libbz2's decoder (out of memory?)");
  }
  bz_stream s_{};
  bool at_boundary_ = true;
};

const char* xz_error(lzma_ret status) {
  switch (status) {
    case LZMA_FORMAT_ERROR: return "not xz data (LZMA_FORMAT_ERROR)";
    case LZMA_OPTIONS_ERROR: return "unsupported compression options (LZMA_OPTIONS_ERROR)";
    case LZMA_DATA_ERROR: return "the data is corrupt (LZMA_DATA_ERROR)";
    case LZMA_MEM_ERROR: return "out of memory (LZMA_MEM_ERROR)";
    default: return "liblzma failed";
  }
}

class XzDecoder final : public StreamDecoder {
 public:
  XzDecoder() : StreamDecoder("xz", "an xz stream") {
    // LZMA_CONCATENATED: streams one after another (and the padding between them) are one text; liblzma then
    // knows the last one has ended only when told the input has (LZMA_FINISH).
    FSDPP_REQUIRE(lzma_stream_decoder(&s_, UINT64_MAX, LZMA_CONCATENATED) == LZMA_OK,
                  "cannot start liblzma's xz decoder (out of memory?)");
  }
  ~XzDecoder() override { lzma_end(&s_); }
  Step decode(const char* in, std::size_t in_size, char* out, std::size_t out_size, bool input_ended) override {
    s_.next_in = reinterpret_cast<const std::uint8_t*>(in);
    s_.avail_in = in_size;
    s_.next_out = reinterpret_cast<std::uint8_t*>(out);
    s_.avail_out = out_size;
    const lzma_ret status = lzma_code(&s_, input_ended ? LZMA_FINISH : LZMA_RUN);
    Step step{in_size - s_.avail_in, out_size - s_.avail_out, ""};
    if (status == LZMA_STREAM_END) {
      at_boundary_ = true;
    } else if (status == LZMA_OK) {
      if (step.consumed > 0 || step.produced > 0) at_boundary_ = false;
    } else if (status != LZMA_BUF_ERROR) {  // LZMA_BUF_ERROR: no progress possible, which the caller sees
      step.error = xz_error(status);
    }
    return step;
  }
  bool at_boundary() const override { return at_boundary_; }

 private:
  lzma_stream s_ = LZMA_STREAM_INIT;
  bool at_boundary_ = true;
};

// A compressed file's decompressed content, through the decoder of its format.
class CompressedFile final : public ByteSource {
 public:
  CompressedFile(const CorpusUnit& unit, std::unique_ptr<StreamDecoder> decoder)
      : file_(open_input(unit.path)), path_(unit.path), decoder_(std::move(decoder)), in_(kCompressedReadBytes, '\0') {}
  std::size_t read(char* dst, std::size_t n) override {
    while (problem_.empty()) {
      if (in_at_ == in_size_ && !file_ended_) refill();
      const bool input_ended = file_ended_ && in_at_ == in_size_;
      if (input_ended && consumed_ == 0) return 0;  // an empty file: no lines
      const StreamDecoder::Step step =
          decoder_->decode(in_.data() + in_at_, in_size_ - in_at_, dst, n, input_ended);
      in_at_ += step.consumed;
      consumed_ += step.consumed;
      if (!step.error.empty()) {
        problem_ = fmt::format("{} cannot decode it: {}", decoder_->format, step.error);
      } else if (step.consumed == 0 && step.produced == 0) {
        if (!input_ended)  // with input and room for output every library moves on; never spin if one does not
          problem_ = fmt::format("{} decoding stopped making progress", decoder_->format);
        else if (!decoder_->at_boundary())
          problem_ = fmt::format("the file ends inside {} (truncated)", decoder_->frame);
        return 0;
      }
      if (step.produced > 0) return step.produced;
    }
    return 0;
  }
  std::string position() const override { return fmt::format(", compressed byte {}", consumed_); }
  std::string truncation() const override { return problem_; }

 private:
  static constexpr std::size_t kCompressedReadBytes = std::size_t{1} << 17;
  void refill() {
    errno = 0;
    in_size_ = std::fread(in_.data(), 1, in_.size(), file_.get());
    in_at_ = 0;
    if (in_size_ == 0 && std::ferror(file_.get()))
      throw UsageError(fmt::format("{}: read failed: {}", path_, std::strerror(errno)));
    file_ended_ = in_size_ == 0;
  }
  File file_;
  std::string path_;
  std::unique_ptr<StreamDecoder> decoder_;
  std::string in_;
  std::size_t in_at_ = 0, in_size_ = 0;  // in_[in_at_, in_size_) is read but not yet decoded
  bool file_ended_ = false;
  std::uint64_t consumed_ = 0;  // compressed bytes decoded
  std::string problem_;         // why the file ends too early or cannot be decoded; "" while it can
};

std::unique_ptr<ByteSource> open_source(const CorpusUnit& unit) {
  switch (unit.kind) {
    case InputKind::json_lines_zst: return std::make_unique<CompressedFile>(unit, std::make_unique<ZstdDecoder>());
    case InputKind::json_lines_gz: return std::make_unique<CompressedFile>(unit, std::make_unique<GzipDecoder>());
    case InputKind::json_lines_bz2: return std::make_unique<CompressedFile>(unit, std::make_unique<Bzip2Decoder>());
    case InputKind::json_lines_xz: return std::make_unique<CompressedFile>(unit, std::make_unique<XzDecoder>());
    case InputKind::text:
    case InputKind::json_lines: break;
  }
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

// The UTF-8 encoding of U+FEFF, which "UTF-8 with signature" files (Windows editors, PowerShell) start with.
constexpr std::string_view kUtf8ByteOrderMark = "\xEF\xBB\xBF";

// Reads the lines of a JSON Lines unit (line numbers of the file are counted only for a message); returns the
// number of empty documents.
std::int64_t read_json_lines(const CorpusUnit& unit, const DocumentOptions& options,
                             const std::function<void(std::string_view)>& on_document,
                             const std::function<void(const BadDocument&)>& on_bad) {
  const std::unique_ptr<ByteSource> source = open_source(unit);
  simdjson::dom::parser parser;
  std::string buffer;
  std::size_t start = 0;       // of the next line in buffer
  std::uint64_t line = 0;      // lines of the unit read so far
  std::int64_t empty = 0;      // blank lines and empty strings, left out
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
      on_bad({BadReason::truncated_compressed, where(), source->truncation()});
      return empty;
    }
    for (;;) {
      std::size_t newline = buffer.find('\n', start);
      if (newline == std::string::npos) {
        if (!end || start == buffer.size()) break;
        newline = buffer.size();  // the last line, without a newline
      }
      ++line;
      std::string_view text_line(buffer.data() + start, newline - start);
      start = std::min(newline + 1, buffer.size());
      const bool file_start = line == 1 && unit.byte_begin == 0;  // a compressed file is one unit from byte 0
      if (file_start && text_line.substr(0, kUtf8ByteOrderMark.size()) == kUtf8ByteOrderMark)
        text_line.remove_prefix(kUtf8ByteOrderMark.size());
      if (text_line.find_first_not_of(" \t\r") == std::string_view::npos) {
        ++empty;
        continue;
      }
      std::string_view document;
      BadDocument bad{};
      if (!document_of_line(parser, text_line, options.field, document, bad)) {
        bad.where = where();
        on_bad(bad);
      } else if (document.empty()) {
        ++empty;
      } else {
        on_document(document);
      }
    }
  }
  return empty;
}

// Returns the number of empty documents: empty pieces between separators, or an empty file without a separator.
std::int64_t read_text(const CorpusUnit& unit, const DocumentOptions& options,
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
  std::int64_t empty = all.empty() && sep.empty() ? 1 : 0;  // without a separator the file is the document
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
    } else if (document.empty()) {
      ++empty;
    } else {
      on_document(document);
    }
    begin = end == all.size() ? end : end + sep.size();
  }
  return empty;
}

}  // namespace

InputKind input_kind_for_path(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  for (const char* archive : {".tar", ".tgz", ".tbz2", ".txz", ".zip"})
    for (const char* compressed : {"", ".zst", ".gz", ".bz2", ".xz"})  // .tar.gz too
      if (name_ends_with(name, std::string(archive) + compressed))
        throw UsageError(fmt::format("{}: an archive ({}{}) is not read; extract its files and name those", path,
                                     archive, compressed));
  if (name_ends_with(name, ".lz4"))
    throw UsageError(fmt::format("{}: .lz4 files are not read; decompress it, or recompress it with zstd, gzip, "
                                 "bzip2 or xz",
                                 path));
  if (name_ends_with(name, ".zst")) return InputKind::json_lines_zst;
  if (name_ends_with(name, ".gz")) return InputKind::json_lines_gz;
  if (name_ends_with(name, ".bz2")) return InputKind::json_lines_bz2;
  if (name_ends_with(name, ".xz")) return InputKind::json_lines_xz;
  if (name_ends_with(name, ".jsonl") || name_ends_with(name, ".json")) return InputKind::json_lines;
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
    case BadReason::truncated_compressed: return "truncated_compressed";
  }
  return "?";
}

void count(SkippedDocuments& skipped, BadReason reason) {
  switch (reason) {
    case BadReason::invalid_utf8: ++skipped.invalid_utf8; break;
    case BadReason::malformed_json: ++skipped.malformed_json; break;
    case BadReason::missing_field: ++skipped.missing_field; break;
    case BadReason::truncated_compressed: ++skipped.truncated_compressed; break;
  }
}

std::int64_t read_unit_documents(const CorpusUnit& unit, const DocumentOptions& options,
                                 const std::function<void(std::string_view)>& on_document,
                                 const std::function<void(const BadDocument&)>& on_bad) {
  if (unit.kind == InputKind::text) return read_text(unit, options, on_document, on_bad);
  return read_json_lines(unit, options, on_document, on_bad);
}

}  // namespace fsdpp
