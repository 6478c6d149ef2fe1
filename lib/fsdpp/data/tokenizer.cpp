#include "fsdpp/data/tokenizer.hpp"

#include "fsdpp/data/bpe_tokenizer.hpp"
#include "fsdpp/data/sentencepiece_tokenizer.hpp"
#include "fsdpp/data/tokenize.hpp"
#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace fsdpp {
namespace {

class ByteLevelTokenizer final : public Tokenizer {
 public:
  std::int64_t vocab_size() const override { return kByteVocabSize; }
  std::string describe() const override { return "byte-level (token = byte, 256 ids)"; }
  std::unique_ptr<Tokenizer> fork() const override { return std::make_unique<ByteLevelTokenizer>(); }
  void encode(std::string_view window, std::size_t length, bool, std::vector<std::uint32_t>& out) override {
    for (std::size_t i = 0; i < length; ++i) out.push_back(static_cast<unsigned char>(window[i]));
  }
  std::string decode(const std::vector<std::uint32_t>& ids) const override {
    std::string text;
    for (std::uint32_t id : ids) {
      if (id >= kByteVocabSize)
        throw UsageError(fmt::format("token id {} is not a byte: the byte-level tokenizer has 256 ids; pass the "
                                     "model's --tokenizer", id));
      text.push_back(static_cast<char>(id));
    }
    return text;
  }
};

bool is_ascii_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

std::unique_ptr<Tokenizer> byte_level_tokenizer() { return std::make_unique<ByteLevelTokenizer>(); }

std::size_t next_chunk_boundary(std::string_view text, std::size_t from) {
  for (std::size_t p = std::max<std::size_t>(from, 1); p < text.size();) {
    const std::size_t newline = text.find('\n', p - 1);
    if (newline == std::string_view::npos || newline + 1 >= text.size()) break;
    if (is_ascii_alnum(text[newline + 1])) return newline + 1;
    p = newline + 2;
  }
  return text.size();
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError(fmt::format("{}: is a directory; --tokenizer takes a tokenizer.json or a SentencePiece .model "
                                 "file",
                                 path));
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw UsageError(fmt::format("{}: cannot open the tokenizer file: {} (--tokenizer takes a Hugging Face "
                                 "tokenizer.json or a SentencePiece .model)",
                                 path, std::strerror(errno)));
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto first = content.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && content[first] == '{') return bpe_tokenizer_from_json(content, path);
  return sentencepiece_tokenizer(path);
}

}  // namespace fsdpp
