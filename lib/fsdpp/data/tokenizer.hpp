#pragma once
// Tokenizers for `fsdpp tokenize`: text -> token ids. Three kinds, all behind one interface:
//   byte-level       token = byte value, vocabulary 256 (no file; tokenize.hpp's byte_tokens)
//   byte-level BPE   a Hugging Face tokenizer.json (GPT-2, Llama 3, Qwen, cl100k/o200k, DeepSeek): bpe_tokenizer.hpp
//   SentencePiece    a .model file (Llama 2, Mistral) through libsentencepiece: sentencepiece_tokenizer.hpp
//
// Large inputs are tokenized a chunk at a time (tokenize.cpp). A chunk ends just before an ASCII letter or digit
// that follows a newline (next_chunk_boundary): no pre-tokenization piece of the regular expressions in use
// (GPT-2, Llama 3, Qwen2, cl100k_base, o200k_base, tekken, DeepSeek, BLOOM) and no special token like
// "<|endoftext|>" spans such a point, so the ids of the chunks, concatenated, are the ids of the whole text.
// Regular expressions may still look ahead past the chunk's end (GPT-2's `\s+(?!\S)`), so encode() sees the text
// that follows the chunk too.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpp {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Every id encode() produces is < vocab_size(): the model.vocab_size a deck needs at least.
  virtual std::int64_t vocab_size() const = 0;
  // "byte-level BPE from tokenizer.json (50257 ids)" and the like, for the log.
  virtual std::string describe() const = 0;
  // Appends the ids of window[0, length) to `out`; window[length, ...) is the text after it (lookahead only).
  // `starts_text`: the chunk begins the whole text (a tokenizer that adds a prefix space does so only there).
  virtual void encode(std::string_view window, std::size_t length, bool starts_text,
                      std::vector<std::uint32_t>& out) = 0;
  // An independent copy for another thread: shares the read-only model, owns its caches and scratch.
  virtual std::unique_ptr<Tokenizer> fork() const = 0;
  // The text of `ids`, as Hugging Face's decode(ids) (special tokens included) or SentencePiece's DecodeIds: the
  // bytes of each token in turn (byte-level tokens may end mid-character; the caller shows the text once whole).
  // An id outside the vocabulary is a UsageError.
  virtual std::string decode(const std::vector<std::uint32_t>& ids) const = 0;
  // The id that ends a document in a corpus (tokenize_corpus.hpp): tokenizer.json's "<|endoftext|>" (GPT-2,
  // Qwen) or "<|end_of_text|>" (Llama 3), SentencePiece's eos; none for the byte-level tokenizer.
  virtual std::optional<std::uint32_t> end_of_text_id() const { return std::nullopt; }
  // The id the tokenizer puts before a text when it adds special tokens (tokenizer.json's TemplateProcessing,
  // Llama 3's "<|begin_of_text|>"; SentencePiece's bos), or none. encode() itself never adds it.
  virtual std::optional<std::uint32_t> bos_id() const { return std::nullopt; }
};

// The tokenizer in `path`: a tokenizer.json (byte-level BPE) or a SentencePiece .model, told apart by content.
// A missing file, bad JSON or an unsupported tokenizer is a UsageError naming the file and the component.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);
// The byte-level tokenizer (vocabulary 256), what `fsdpp tokenize` uses without --tokenizer.
std::unique_ptr<Tokenizer> byte_level_tokenizer();

// The first chunk boundary at or after `from` in `text`: a position p where text[p-1] is '\n' and text[p] is an
// ASCII letter or digit; text.size() when there is none.
std::size_t next_chunk_boundary(std::string_view text, std::size_t from);

}  // namespace fsdpp
