#pragma once
// A tokenized corpus on disk: a folder of token shards (llm.c .bin files, data/token_file.hpp) and one index,
// `index.json`, written by `fsdpp tokenize` in corpus mode and read by training (data.sources) and `fsdpp eval`.
//
// The index says what the shards are (tokenizer, vocabulary, the end-of-text id that ends every document) and, per
// shard, where its text came from (an input file and a byte range of it), how many documents and tokens it holds,
// how many empty documents were left out and how many were skipped as bad input (--on-bad skip), so that nothing
// is lost silently: for JSON Lines, documents + empty_documents + skipped = the lines of the byte range. Shards
// are listed in corpus order: their concatenation is the corpus's token stream, each document followed by eot_id.
//
// Example:
//   {"format": "fsdpp-corpus", "version": 1, "tokenizer": "byte-level BPE from tokenizer.json (50257 ids)",
//    "vocab_size": 50257, "eot_id": 50256, "bos_id": null, "token_bytes": 2,
//    "shards": [{"path": "shard-00000.bin", "source": "/data/web/part-0.jsonl.zst", "byte_begin": 0,
//                "byte_end": 81234567, "documents": 10234, "empty_documents": 3, "tokens": 4567890,
//                "bytes": 20456789, "skipped": {"invalid_utf8": 0, "malformed_json": 1, "missing_field": 0,
//                                               "truncated_compressed": 0}}]}
// (and the sums "documents", "empty_documents", "tokens", "skipped" over the shards). Indexes written before
// fsdpp counted empty documents are read with 0 there, and their "truncated_zstd" as truncated_compressed.
#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

inline constexpr const char* kCorpusIndexName = "index.json";
inline constexpr const char* kCorpusFormat = "fsdpp-corpus";
inline constexpr int kCorpusVersion = 1;

// Documents left out under --on-bad skip, by reason (by default each reason stops the run instead).
struct SkippedDocuments {
  std::int64_t invalid_utf8 = 0;    // text that is not UTF-8
  std::int64_t malformed_json = 0;  // a JSON Lines line that does not parse
  std::int64_t missing_field = 0;   // a JSON object without the --field (or it is not a string)
  // A compressed input (.zst, .gz, .bz2, .xz) that ends inside a frame or cannot be decoded: its partial last line
  // (the rest of the file is lost).
  std::int64_t truncated_compressed = 0;
  std::int64_t total() const { return invalid_utf8 + malformed_json + missing_field + truncated_compressed; }
  SkippedDocuments& operator+=(const SkippedDocuments& o);
};

struct CorpusShard {
  std::string path;              // the token file, relative to the index's folder
  std::string source;            // the input it was made from, as given on the command line
  std::uint64_t byte_begin = 0;  // the input's bytes [byte_begin, byte_end) (of the file as stored if compressed)
  std::uint64_t byte_end = 0;
  std::int64_t documents = 0;    // documents written, each followed by eot_id
  std::int64_t empty_documents = 0;  // left out: blank lines, empty strings, empty pieces of text
  std::int64_t tokens = 0;       // tokens in the shard, separators included
  std::int64_t bytes = 0;        // text bytes tokenized (after decompression and JSON decoding)
  SkippedDocuments skipped;
};

struct CorpusIndex {
  std::string tokenizer;         // Tokenizer::describe()
  std::int64_t vocab_size = 0;   // every token is below it
  std::int64_t eot_id = -1;      // after every document
  std::int64_t bos_id = -1;      // before every document when the tokenizer adds one; -1: none
  int token_bytes = 2;           // per token in the shards
  std::vector<CorpusShard> shards;

  std::int64_t documents() const;
  std::int64_t empty_documents() const;
  std::int64_t tokens() const;
  SkippedDocuments skipped() const;
};

// `path` is a corpus folder or its index file: the index file's path. Does not check that it exists.
std::string corpus_index_path(const std::string& path);
// True when `path` is a folder holding index.json, or a file named index.json.
bool is_corpus(const std::string& path);
// Reads and checks the index (format, version, fields, shard paths inside the folder). A missing or malformed
// index is a UsageError naming the file and the field.
CorpusIndex read_corpus_index(const std::string& path);
// Writes the index into `folder` atomically (a temporary file renamed over index.json), so a reader sees the old
// index or the new one, never a part.
void write_corpus_index(const std::string& folder, const CorpusIndex& index);
// The JSON of one shard entry and back (the tokenizer's per-shard completion records use the same text). Unlike an
// index, a record must have every field: one written by an older fsdpp (no empty_documents) is a UsageError, so
// that a resumed run redoes its unit rather than count it incompletely.
std::string to_json_text(const CorpusShard& shard);
CorpusShard corpus_shard_from_json_text(const std::string& text, const std::string& where);

// The corpus's token stream: its shards' tokens in index order (each shard checked against its recorded count).
std::vector<std::uint32_t> load_corpus_tokens(const std::string& path);

}  // namespace fsdpp
