#pragma once
// `fsdpp tokenize`: a text file becomes a token file for data.source. Byte-level by default (token = byte value,
// vocabulary 256: crude as language modelling goes, but it needs no vocabulary file and accepts any input), or
// through a tokenizer file (tokenizer.hpp: a Hugging Face byte-level BPE tokenizer.json or a SentencePiece .model).
//
// The input is streamed: read a chunk at a time (chunks end at tokenizer.hpp's next_chunk_boundary), so memory
// stays bounded whatever its size. On N ranks each rank tokenizes one byte range (split at the same kind of
// boundary) into a part file next to the output, and the parts are then copied into the output at their offsets:
// the file is byte-for-byte the one a single rank writes.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpp {

inline constexpr int kByteVocabSize = 256;

std::vector<std::uint32_t> byte_tokens(std::string_view text);
// Inverse of byte_tokens, for printing samples; a token >= 256 is a UsageError.
std::string bytes_from_tokens(const std::vector<std::uint32_t>& tokens);

struct TokenizeOptions {
  std::string tokenizer_path;                         // empty: byte-level
  std::size_t chunk_bytes = std::size_t{16} << 20;    // text read and tokenized at a time, per rank
  double progress_seconds = 10;                       // a progress line this often (rank 0), 0: never
};

struct TokenizeSummary {
  std::int64_t tokens = 0;      // written, all ranks together
  std::int64_t bytes = 0;       // of text read
  std::int64_t vocab_size = 0;  // every token is below it: the deck's model.vocab_size
  int token_bytes = 2;          // per token in the file (.bin: 2 = GPT-2 header, 4 = Llama 3 header)
  std::string tokenizer;        // Tokenizer::describe()
  double seconds = 0;           // wall time of the whole job
};

// Reads `text_path` and writes its tokens to `out_path` in the format its extension names (.bin: llm.c's header,
// uint16 tokens while the vocabulary fits, else uint32; .u16; .u32). Collective over `comm`; every problem (empty or
// unreadable input, a bad tokenizer, a vocabulary too large for .u16) is the same UsageError on every rank.
TokenizeSummary tokenize_file(MPI_Comm comm, const std::string& text_path, const std::string& out_path,
                              const TokenizeOptions& options = {});
// Byte-level, on this process alone; returns the token count (= the file's size in bytes).
std::int64_t tokenize_file(const std::string& text_path, const std::string& out_path);

}  // namespace fsdpp
