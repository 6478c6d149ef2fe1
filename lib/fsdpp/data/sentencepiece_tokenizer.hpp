#pragma once
// A SentencePiece .model (Llama 2, Mistral) through Debian's libsentencepiece. The text is encoded a line at a
// time, each line with its '\n' (so Llama 2's byte fallback keeps the newlines as <0x0A>), and each line starts
// with SentencePiece's dummy prefix like a sentence of its own: the ids are those of Python's
// `[sp.encode(line) for line in lines]`, concatenated. Chunks of the streamed input end at line ends, so the
// chunking never changes the ids.
#include "fsdpp/data/tokenizer.hpp"

#include <memory>
#include <string>

namespace fsdpp {

// A file SentencePiece cannot load is a UsageError naming the file and SentencePiece's reason.
std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& model_path);

}  // namespace fsdpp
