#include "fsdpp/data/tokenize.hpp"

#include "fsdpp/data/token_file.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

namespace fsdpp {

std::vector<std::uint32_t> byte_tokens(std::string_view text) {
  std::vector<std::uint32_t> tokens(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string bytes_from_tokens(const std::vector<std::uint32_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    FSDPP_REQUIRE(tokens[i] < kByteVocabSize, "token {} at position {} is not a byte (byte-level vocabulary is {})",
                  tokens[i], i, kByteVocabSize);
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return text;
}

std::int64_t tokenize_file(const std::string& text_path, const std::string& out_path) {
  // Resolve the output format first: a bad output name should fail before a large input is read.
  const TokenFormat format = token_format_for_path(out_path);
  std::error_code ec;
  if (std::filesystem::is_directory(text_path, ec))
    throw UsageError(fmt::format("{}: is a directory, not a text file", text_path));
  errno = 0;
  std::ifstream in(text_path, std::ios::binary);
  if (!in) throw UsageError(fmt::format("{}: cannot open text file: {}", text_path, std::strerror(errno)));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw UsageError(fmt::format("{}: read failed: {}", text_path, std::strerror(errno)));
  FSDPP_REQUIRE(!text.empty(), "{}: the text file is empty; there is nothing to tokenize", text_path);
  save_tokens(out_path, byte_tokens(text), format);
  return static_cast<std::int64_t>(text.size());
}

}  // namespace fsdpp
