// fsdpp tokenize [--tokenizer FILE] <text-file> <out.bin>: any text becomes training data for data.source.
// Byte-level tokens (vocab 256) by default; with --tokenizer, a Hugging Face byte-level BPE tokenizer.json or a
// SentencePiece .model. Streamed, and split over the ranks when launched on several.
#include "commands.hpp"

#include "fsdpp/data/tokenize.hpp"
#include "fsdpp/runtime/log.hpp"

#include <mpi.h>

#include <algorithm>

namespace fsdpp::app {

Command add_tokenize_command(CLI::App& app) {
  auto* cli = app.add_subcommand("tokenize", "Turn a text file into tokens for data.source (byte-level, or a "
                                             "tokenizer.json / SentencePiece .model)");
  struct Args {
    std::string text, out;
    TokenizeOptions options;
  };
  auto args = std::make_shared<Args>();
  cli->add_option("text", args->text, "Text file to read")->required();
  cli->add_option("out", args->out, "Token file to write: .bin (llm.c format), .u16 or .u32")->required();
  cli->add_option("--tokenizer", args->options.tokenizer_path,
                  "Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, Qwen) or SentencePiece .model "
                  "(Llama 2, Mistral); default: byte-level tokens, vocab 256");
  cli->add_option("--chunk-bytes", args->options.chunk_bytes,
                  "Text tokenized at a time per rank (bounds the memory; default 16 MiB)")
      ->check(CLI::PositiveNumber);
  cli->add_option("--progress-seconds", args->options.progress_seconds,
                  "Seconds between progress lines (0: none)")
      ->check(CLI::NonNegativeNumber);
  return {cli, [args](Runtime& rt) {
            const TokenizeSummary s = tokenize_file(rt.world(), args->text, args->out, args->options);
            Log::info("tokenizer: {}", s.tokenizer);
            Log::info("wrote {} tokens (vocab {}, uint{}) to {} from {:.1f} MiB of text in {:.2f} s ({:.1f} MB/s on "
                      "{} rank(s)); train on it with data.source={} model.vocab_size={}",
                      s.tokens, s.vocab_size, 8 * s.token_bytes, args->out, s.bytes / 1048576.0, s.seconds,
                      s.bytes / 1e6 / std::max(s.seconds, 1e-9), rt.size(), args->out, s.vocab_size);
            return 0;
          },
          [] { return false; }};
}

}  // namespace fsdpp::app
