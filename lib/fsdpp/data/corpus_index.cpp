#include "fsdpp/data/corpus_index.hpp"

#include "fsdpp/data/token_file.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/staged_output.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fsdpp {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

Json to_json(const SkippedDocuments& s) {
  return {{"invalid_utf8", s.invalid_utf8},
          {"malformed_json", s.malformed_json},
          {"missing_field", s.missing_field},
          {"truncated_compressed", s.truncated_compressed}};
}

Json to_json(const CorpusShard& s) {
  return {{"path", s.path},           {"source", s.source},       {"byte_begin", s.byte_begin},
          {"byte_end", s.byte_end},   {"documents", s.documents}, {"empty_documents", s.empty_documents},
          {"tokens", s.tokens},       {"bytes", s.bytes},         {"skipped", to_json(s.skipped)}};
}

// A required field of `object`, with a message naming `where` and the field when it is missing or mistyped.
template <class T> T field(const Json& object, const char* name, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end())
    throw UsageError(fmt::format("{}: the field \"{}\" is missing; rewrite the corpus with fsdpp tokenize", where, name));
  try {
    return it->get<T>();
  } catch (const Json::exception&) {
    throw UsageError(fmt::format("{}: the field \"{}\" has the wrong type ({}); rewrite the corpus with fsdpp tokenize",
                                 where, name, it->type_name()));
  }
}

CorpusShard shard_from_json(const Json& j, const std::string& where) {
  CorpusShard s;
  s.path = field<std::string>(j, "path", where);
  s.source = field<std::string>(j, "source", where);
  s.byte_begin = field<std::uint64_t>(j, "byte_begin", where);
  s.byte_end = field<std::uint64_t>(j, "byte_end", where);
  s.documents = field<std::int64_t>(j, "documents", where);
  // Absent from indexes written before fsdpp counted empty documents; such a corpus still trains.
  s.empty_documents = j.contains("empty_documents") ? field<std::int64_t>(j, "empty_documents", where) : 0;
  s.tokens = field<std::int64_t>(j, "tokens", where);
  s.bytes = field<std::int64_t>(j, "bytes", where);
  const Json skipped = field<Json>(j, "skipped", where);
  s.skipped.invalid_utf8 = field<std::int64_t>(skipped, "invalid_utf8", where);
  s.skipped.malformed_json = field<std::int64_t>(skipped, "malformed_json", where);
  s.skipped.missing_field = field<std::int64_t>(skipped, "missing_field", where);
  // Named after zstd, the one compression read, in indexes written before .gz, .bz2 and .xz were.
  s.skipped.truncated_compressed = skipped.contains("truncated_zstd") && !skipped.contains("truncated_compressed")
                                       ? field<std::int64_t>(skipped, "truncated_zstd", where)
                                       : field<std::int64_t>(skipped, "truncated_compressed", where);
  FSDPP_REQUIRE(s.documents >= 0 && s.empty_documents >= 0 && s.tokens >= 0 && s.bytes >= 0 &&
                    s.byte_begin <= s.byte_end,
                "{}: shard {} has negative counts or an empty byte range", where, s.path);
  FSDPP_REQUIRE(!s.path.empty() && fs::path(s.path).is_relative() && s.path.find("..") == std::string::npos,
                "{}: shard path \"{}\" must be a file name inside the corpus folder", where, s.path);
  return s;
}

Json parse_file(const std::string& path) {
  std::ifstream in(path);
  FSDPP_REQUIRE(in.good(), "{}: cannot open the corpus index (is this a folder written by fsdpp tokenize?)", path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return Json::parse(text.str());
  } catch (const Json::parse_error& e) {
    throw UsageError(fmt::format("{}: the corpus index is not valid JSON ({}); rewrite it with fsdpp tokenize", path,
                                 e.what()));
  }
}

}  // namespace

SkippedDocuments& SkippedDocuments::operator+=(const SkippedDocuments& o) {
  invalid_utf8 += o.invalid_utf8;
  malformed_json += o.malformed_json;
  missing_field += o.missing_field;
  truncated_compressed += o.truncated_compressed;
  return *this;
}

std::int64_t CorpusIndex::documents() const {
  std::int64_t n = 0;
  for (const CorpusShard& s : shards) n += s.documents;
  return n;
}

std::int64_t CorpusIndex::empty_documents() const {
  std::int64_t n = 0;
  for (const CorpusShard& s : shards) n += s.empty_documents;
  return n;
}

std::int64_t CorpusIndex::tokens() const {
  std::int64_t n = 0;
  for (const CorpusShard& s : shards) n += s.tokens;
  return n;
}

SkippedDocuments CorpusIndex::skipped() const {
  SkippedDocuments n;
  for (const CorpusShard& s : shards) n += s.skipped;
  return n;
}

std::string corpus_index_path(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return (fs::path(path) / kCorpusIndexName).string();
  return path;
}

bool is_corpus(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::is_regular_file(fs::path(path) / kCorpusIndexName, ec);
  return fs::path(path).filename() == kCorpusIndexName && fs::is_regular_file(path, ec);
}

std::string to_json_text(const CorpusShard& shard) { return to_json(shard).dump(); }

CorpusShard corpus_shard_from_json_text(const std::string& text, const std::string& where) {
  Json record;
  try {
    record = Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw UsageError(fmt::format("{}: not a valid shard record ({})", where, e.what()));
  }
  FSDPP_REQUIRE(record.is_object() && record.contains("empty_documents"),
                "{}: a shard record without \"empty_documents\" (written by an older fsdpp); its unit is redone",
                where);
  return shard_from_json(record, where);
}

CorpusIndex read_corpus_index(const std::string& path) {
  const std::string file = corpus_index_path(path);
  const Json j = parse_file(file);
  FSDPP_REQUIRE(j.is_object() && j.value("format", "") == kCorpusFormat,
                "{}: not an fsdpp corpus index (\"format\" is not \"{}\")", file, kCorpusFormat);
  const int version = field<int>(j, "version", file);
  FSDPP_REQUIRE(version == kCorpusVersion, "{}: corpus index version {} is not the {} this fsdpp reads", file,
                version, kCorpusVersion);
  CorpusIndex index;
  index.tokenizer = field<std::string>(j, "tokenizer", file);
  index.vocab_size = field<std::int64_t>(j, "vocab_size", file);
  index.eot_id = field<std::int64_t>(j, "eot_id", file);
  index.bos_id = j.contains("bos_id") && !j["bos_id"].is_null() ? field<std::int64_t>(j, "bos_id", file) : -1;
  index.token_bytes = field<int>(j, "token_bytes", file);
  FSDPP_REQUIRE(index.vocab_size > 0 && index.eot_id >= 0 && index.eot_id < index.vocab_size &&
                    index.bos_id < index.vocab_size && (index.token_bytes == 2 || index.token_bytes == 4),
                "{}: vocab_size {}, eot_id {}, bos_id {} or token_bytes {} is out of range", file, index.vocab_size,
                index.eot_id, index.bos_id, index.token_bytes);
  const Json shards = field<Json>(j, "shards", file);
  FSDPP_REQUIRE(shards.is_array(), "{}: \"shards\" is not a list", file);
  for (std::size_t i = 0; i < shards.size(); ++i)
    index.shards.push_back(shard_from_json(shards[i], fmt::format("{}: shards[{}]", file, i)));
  return index;
}

void write_corpus_index(const std::string& folder, const CorpusIndex& index) {
  Json shards = Json::array();
  for (const CorpusShard& s : index.shards) shards.push_back(to_json(s));
  const Json j = {{"format", kCorpusFormat},
                  {"version", kCorpusVersion},
                  {"tokenizer", index.tokenizer},
                  {"vocab_size", index.vocab_size},
                  {"eot_id", index.eot_id},
                  {"bos_id", index.bos_id >= 0 ? Json(index.bos_id) : Json(nullptr)},
                  {"token_bytes", index.token_bytes},
                  {"documents", index.documents()},
                  {"empty_documents", index.empty_documents()},
                  {"tokens", index.tokens()},
                  {"skipped", to_json(index.skipped())},
                  {"shards", shards}};
  write_file_whole((fs::path(folder) / kCorpusIndexName).string(), j.dump(1) + "\n");
}

std::vector<std::uint32_t> load_corpus_tokens(const std::string& path) {
  const CorpusIndex index = read_corpus_index(path);
  const fs::path folder = fs::path(corpus_index_path(path)).parent_path();
  std::vector<std::uint32_t> tokens;
  tokens.reserve(static_cast<std::size_t>(index.tokens()));
  for (const CorpusShard& s : index.shards) {
    const std::string shard_path = (folder / s.path).string();
    const std::vector<std::uint32_t> part = load_tokens(shard_path, index.vocab_size);
    FSDPP_REQUIRE(static_cast<std::int64_t>(part.size()) == s.tokens,
                  "{}: holds {} tokens but the corpus index says {}; the corpus is incomplete or was changed, "
                  "rerun fsdpp tokenize on it",
                  shard_path, part.size(), s.tokens);
    tokens.insert(tokens.end(), part.begin(), part.end());
  }
  FSDPP_REQUIRE(!tokens.empty(), "{}: the corpus has no tokens", corpus_index_path(path));
  return tokens;
}

}  // namespace fsdpp
