#pragma once
// `fsdpp tokenize` in corpus mode: many inputs (text, JSON Lines, JSON Lines compressed with zstd, gzip, bzip2 or
// xz; corpus_reader.hpp) become a folder of token shards and an index.json (corpus_index.hpp) for data.sources.
//
// Each document's ids are [bos] + ids(document) + [eot]: the document is tokenized as a whole text, as Hugging
// Face's encode(document, add_special_tokens=False) would (bos when the tokenizer adds one, Tokenizer::bos_id), and
// the end-of-text id ends it (Tokenizer::end_of_text_id, or --eot-id; the vocabulary grows to hold it).
//
// The inputs are cut into work units independent of the rank count (corpus_reader.hpp's plan_corpus_units); unit
// i becomes shard-{i:05}.bin and is tokenized by rank i mod N, in rounds of N units after which the ranks agree on
// errors. So 1 and N ranks write the same bytes. A shard is written under a temporary name and renamed when
// complete, then a completion record shard-{i:05}.json (its CorpusShard) is written beside it; rank 0 writes
// index.json from the records at the end. manifest.json keeps the arguments that decide the output, so that
// rerunning the same command after a crash redoes only the units without a complete shard and record, and a
// different command on the folder is refused with what differs.
//
// Bad input stops every rank with the file:line and what to do, or with skip_bad the document is left out and
// counted per reason (in the records, the index and the summary). Empty documents are left out and counted there
// too; a record keeps its unit's counts, so a resumed run and any rank count sum to the same index.
#include "fsdpp/data/corpus_index.hpp"

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

inline constexpr const char* kCorpusManifestName = "manifest.json";

struct CorpusOptions {
  std::vector<std::string> inputs;  // paths and glob patterns (each pattern's matches sorted)
  std::string files_from;           // a file listing more inputs, one a line ("" or "-"... : none)
  std::string output_dir;
  std::string tokenizer_path;       // empty: byte-level (then eot_id is required)
  std::string field = "text";       // JSON Lines: the field with the text; dots go into nested objects
  std::string split_on;             // text files: separator between documents (empty: one document per file)
  std::uint64_t shard_bytes = std::uint64_t{64} << 20;  // uncompressed inputs are cut into units about this size
  std::int64_t eot_id = -1;         // >= 0: overrides the tokenizer's end-of-text id
  bool skip_bad = false;            // --on-bad skip
  std::size_t chunk_bytes = std::size_t{16} << 20;  // a larger document is tokenized this much at a time
  double progress_seconds = 10;     // rank 0 prints a progress line this often; 0: never
};

struct CorpusSummary {
  CorpusIndex index;
  std::int64_t text_bytes = 0;  // tokenized in this run (units reused from an earlier run not counted)
  std::int64_t reused_shards = 0;
  double seconds = 0;
};

// The inputs named by `patterns` (paths, or glob patterns expanded and sorted) and the lines of `files_from`, in
// that order. A pattern without matches, or a list that cannot be read, is a UsageError.
std::vector<std::string> expand_corpus_inputs(const std::vector<std::string>& patterns, const std::string& files_from);

// "\n", "\t", "\\" and "\r" in a command-line separator become the characters.
std::string unescape_separator(const std::string& text);

// Collective over `comm`; every problem is the same UsageError on every rank.
CorpusSummary tokenize_corpus(MPI_Comm comm, const CorpusOptions& options);

}  // namespace fsdpp
