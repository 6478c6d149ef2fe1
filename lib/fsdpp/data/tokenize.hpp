#pragma once
// Byte-level tokenizer: token = byte value, vocabulary 256. Crude as language modelling goes, but it needs no
// vocabulary file and accepts any input (UTF-8 or not), so any text becomes training data for `fsdpp train`.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpp {

inline constexpr int kByteVocabSize = 256;

std::vector<std::uint32_t> byte_tokens(std::string_view text);
// Inverse of byte_tokens, for printing samples; a token >= 256 is a UsageError.
std::string bytes_from_tokens(const std::vector<std::uint32_t>& tokens);

// Reads `text_path` as bytes and writes its tokens to `out_path` in the format its extension names (.bin: the
// GPT-2 format with header, as `fsdpp tokenize` documents; .u16 and .u32 also work). Returns the token count
// (= the file's size in bytes). An empty or unreadable input is a UsageError naming the file.
std::int64_t tokenize_file(const std::string& text_path, const std::string& out_path);

}  // namespace fsdpp
