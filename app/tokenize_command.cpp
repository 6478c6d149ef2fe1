// fsdpp tokenize [options] INPUT... OUTPUT: text becomes training data.
//   OUTPUT a token file (.bin, .u16, .u32): one text file, tokenized as one stream (data.source).
//   OUTPUT a folder (any other name): corpus mode, many inputs (files, glob patterns, --files-from) of text, JSON
//   Lines or compressed JSON Lines (.zst, .gz, .bz2, .xz), one document each (or per line, or per --split-on), each
//   ended by the end-of-text id, into token shards and an index.json (data.sources); resumable, split over the
//   ranks.
// Byte-level tokens (vocab 256) by default; with --tokenizer, a Hugging Face byte-level BPE tokenizer.json or a
// SentencePiece .model.
#include "commands.hpp"

#include "fsdpp/data/token_file.hpp"
#include "fsdpp/data/tokenize.hpp"
#include "fsdpp/data/tokenize_corpus.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"

#include <mpi.h>

#include <algorithm>

namespace fsdpp::app {
namespace {

bool is_token_file(const std::string& path) {
  for (const char* ext : {".bin", ".u16", ".u32"}) {
    const std::string e = ext;
    if (path.size() > e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0) return true;
  }
  return false;
}

struct Args {
  std::vector<std::string> paths;  // inputs, then the output
  TokenizeOptions options;
  CorpusOptions corpus;
  std::string on_bad = "stop";
};

int run_corpus(Runtime& rt, Args& a) {
  a.corpus.output_dir = a.paths.back();
  a.corpus.inputs.assign(a.paths.begin(), a.paths.end() - 1);
  a.corpus.tokenizer_path = a.options.tokenizer_path;
  a.corpus.chunk_bytes = a.options.chunk_bytes;
  a.corpus.progress_seconds = a.options.progress_seconds;
  a.corpus.skip_bad = a.on_bad == "skip";
  a.corpus.split_on = unescape_separator(a.corpus.split_on);
  const CorpusSummary s = tokenize_corpus(rt.world(), a.corpus);
  const CorpusIndex& index = s.index;
  const SkippedDocuments skipped = index.skipped();
  Log::info("tokenizer: {}", index.tokenizer);
  if (skipped.total() > 0)
    Log::info("skipped {} bad document(s): {} invalid_utf8, {} malformed_json, {} missing_field, {} "
              "truncated_compressed",
              skipped.total(), skipped.invalid_utf8, skipped.malformed_json, skipped.missing_field,
              skipped.truncated_compressed);
  Log::info("wrote {} documents, {} tokens (vocab {}, eot {}, uint{}) in {} shards ({} from an earlier run) to {}; "
            "{} empty document(s) left out; skipped {}; {:.1f} MiB of text in {:.2f} s ({:.1f} MB/s on {} rank(s)); "
            "train on it with data.source={} model.vocab_size={} (documents end with data.eot_id={})",
            index.documents(), index.tokens(), index.vocab_size, index.eot_id, 8 * index.token_bytes,
            index.shards.size(), s.reused_shards, a.corpus.output_dir, index.empty_documents(), skipped.total(),
            s.text_bytes / 1048576.0, s.seconds, s.text_bytes / 1e6 / std::max(s.seconds, 1e-9), rt.size(),
            a.corpus.output_dir, index.vocab_size, index.eot_id);
  return 0;
}

int run_single_file(Runtime& rt, const Args& a) {
  const std::string& out = a.paths.back();
  if (a.paths.size() != 2)
    throw UsageError(fmt::format("{}: a token file takes exactly one text file; to tokenize several inputs, name an "
                                 "output folder instead (corpus mode)",
                                 out));
  const TokenizeSummary s = tokenize_file(rt.world(), a.paths[0], out, a.options);
  Log::info("tokenizer: {}", s.tokenizer);
  Log::info("wrote {} tokens (vocab {}, uint{}) to {} from {:.1f} MiB of text in {:.2f} s ({:.1f} MB/s on "
            "{} rank(s)); train on it with data.source={} model.vocab_size={}",
            s.tokens, s.vocab_size, 8 * s.token_bytes, out, s.bytes / 1048576.0, s.seconds,
            s.bytes / 1e6 / std::max(s.seconds, 1e-9), rt.size(), out, s.vocab_size);
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  auto* cli = app.add_subcommand(
      "tokenize",
      "Turn text into tokens (byte-level, or a tokenizer.json / SentencePiece .model).\n"
      "  fsdpp tokenize [options] TEXT OUT.bin     one text file, one token stream (.bin, .u16 or .u32), for "
      "data.source\n"
      "  fsdpp tokenize [options] INPUT... DIR     corpus mode: files or glob patterns (and --files-from) of .txt "
      "(one document per file, or per --split-on), .jsonl (--field of each line) and .jsonl compressed with zstd, "
      "gzip, bzip2 or xz (.jsonl.zst, .json.gz, .jsonl.bz2, .jsonl.xz); each document ends with the end-of-text id; "
      "writes DIR/shard-NNNNN.bin and DIR/index.json for data.sources. Resumable: rerun the same command after a "
      "crash.");
  auto args = std::make_shared<Args>();
  cli->add_option("paths", args->paths, "Inputs, then the output: a token file (.bin, .u16, .u32) or a folder")
      ->required()
      ->expected(1, -1);
  cli->add_option("--tokenizer", args->options.tokenizer_path,
                  "Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen) or SentencePiece .model "
                  "(Llama 2, Mistral); default: byte-level tokens, vocab 256");
  cli->add_option("--chunk-bytes", args->options.chunk_bytes,
                  "Text tokenized at a time per rank (bounds the memory; default 16 MiB)")
      ->check(CLI::PositiveNumber);
  cli->add_option("--progress-seconds", args->options.progress_seconds, "Seconds between progress lines (0: none)")
      ->check(CLI::NonNegativeNumber);
  const std::string group = "Corpus mode (the output is a folder)";
  cli->add_option("--files-from", args->corpus.files_from, "A file listing more inputs, one a line")->group(group);
  cli->add_option("--field", args->corpus.field,
                  "JSON Lines: the field holding the text; dots go into nested objects (meta.body)")
      ->capture_default_str()
      ->group(group);
  cli->add_option("--split-on", args->corpus.split_on,
                  "Text files: the separator between documents (\\n, \\t escapes; e.g. '\\n\\n'); default: one "
                  "document per file")
      ->group(group);
  cli->add_option("--shard-bytes", args->corpus.shard_bytes,
                  "Uncompressed inputs are cut at line ends into work units (one shard each) of about this size; a "
                  "compressed file (.zst, .gz, .bz2, .xz) is one unit")
      ->capture_default_str()
      ->check(CLI::PositiveNumber)
      ->group(group);
  cli->add_option("--eot-id", args->corpus.eot_id,
                  "The id after every document (default: the tokenizer's <|endoftext|>, <|end_of_text|> or eos; "
                  "required with byte-level tokens, e.g. 256, and the vocabulary grows to hold it)")
      ->check(CLI::NonNegativeNumber)
      ->group(group);
  cli->add_option("--on-bad", args->on_bad,
                  "Bad input (invalid UTF-8, a malformed JSON line, a missing or non-string field, a truncated or "
                  "corrupt compressed file): stop with its file:line, or skip the document and count it (summary "
                  "and index.json)")
      ->check(CLI::IsMember({"stop", "skip"}))
      ->capture_default_str()
      ->group(group);
  return {cli, [args, cli, group](Runtime& rt) {
            if (args->paths.size() < 2 && args->corpus.files_from.empty())
              throw UsageError("tokenize: name the input(s) and then the output (a token file or a folder)");
            if (!is_token_file(args->paths.back())) return run_corpus(rt, *args);
            for (const CLI::Option* option : cli->get_options())
              if (option->get_group() == group && option->count() > 0)
                throw UsageError(fmt::format("tokenize: {} is for corpus mode, but {} is a token file; name an output "
                                             "folder to tokenize a corpus",
                                             option->get_name(), args->paths.back()));
            return run_single_file(rt, *args);
          },
          [] { return false; }};
}

}  // namespace fsdpp::app
