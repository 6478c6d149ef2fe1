#pragma once
// The documents of a corpus's input files, for `fsdpp tokenize` in corpus mode (tokenize_corpus.hpp).
//
// Kinds, by extension:
//   .jsonl (and any other name ending .json)  JSON Lines: one object a line, the document is the string at a
//                                             field (`text`, or a dotted path such as `meta.body`)
//   .zst, .gz, .bz2, .xz (.jsonl.zst,         the same, compressed, streamed through libzstd, zlib, libbz2 or
//   .json.gz, ...)                            liblzma; a file may hold several frames / members / streams one
//                                             after another (`cat a.gz b.gz`), read as one text
//   anything else (.txt, .md, ...)            plain text: the whole file is one document, or with a separator
//                                             (split_on) the pieces between separators are
// A JSON Lines file may start with a UTF-8 byte-order mark (EF BB BF, "UTF-8 with signature"): it is skipped.
// Empty documents (and blank JSON Lines lines) are left out and counted. .lz4 and archives (.tar, .tar.gz, .tgz,
// .zip, ...) are refused.
//
// Work units: the inputs are cut into units independent of the rank count. A compressed file is one unit; an
// uncompressed JSON Lines file larger than `shard_bytes` is cut at line ends, a text file with a separator just
// after a separator, so that every document lies in one unit and the units' documents, in order, are the
// documents of the inputs.
//
// Bad input (text that is not UTF-8, a line that is not JSON, an object without the field or with a non-string
// there, a compressed file that ends inside a frame or cannot be decoded) goes to the caller's on_bad with
// `file:line` (and the compressed byte offset for a compressed file) and the reason, and the document is left out.
#include "fsdpp/data/corpus_index.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpp {

enum class InputKind { text, json_lines, json_lines_zst, json_lines_gz, json_lines_bz2, json_lines_xz };

// The kind of `path` from its name; a compression fsdpp cannot read is a UsageError.
InputKind input_kind_for_path(const std::string& path);

struct CorpusUnit {
  std::string path;  // as given (after glob expansion)
  InputKind kind = InputKind::text;
  std::uint64_t byte_begin = 0, byte_end = 0;  // of the file as stored (compressed for a compressed file)
};

// The units of `paths` in order (a file's units in byte order). Reads a little of each file to find the cuts;
// a missing or unreadable file is a UsageError naming it.
std::vector<CorpusUnit> plan_corpus_units(const std::vector<std::string>& paths, std::uint64_t shard_bytes,
                                          const std::string& split_on);

enum class BadReason { invalid_utf8, malformed_json, missing_field, truncated_compressed };
const char* to_string(BadReason reason);  // the SkippedDocuments field's name: "invalid_utf8", ...
void count(SkippedDocuments& skipped, BadReason reason);

struct BadDocument {
  BadReason reason;
  std::string where;  // "file:line" (and ", compressed byte N" for a compressed file)
  std::string what;   // what is wrong, e.g. "the field \"text\" is a number, not a string"
};

struct DocumentOptions {
  std::string field = "text";  // JSON Lines: the field holding the text (dots go into nested objects)
  std::string split_on;        // text files: the separator between documents; empty: one document per file
};

// Calls on_document for each document of `unit` in order and on_bad for each bad one (which may throw to stop).
// The string_view is valid during the call only. Returns the number of empty documents left out (blank lines and
// empty strings of JSON Lines, empty pieces of text), so that documents + empty + bad = the unit's lines for JSON
// Lines.
std::int64_t read_unit_documents(const CorpusUnit& unit, const DocumentOptions& options,
                                 const std::function<void(std::string_view)>& on_document,
                                 const std::function<void(const BadDocument&)>& on_bad);

}  // namespace fsdpp
