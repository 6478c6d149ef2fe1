#pragma once
// UTF-8 as Rust's str and Python's strict decoder define it (no overlong forms, no surrogates, nothing past
// U+10FFFF): what Hugging Face `tokenizers` accepts as text, and what the pre-tokenizer's engines are given.
#include <cstddef>
#include <string>
#include <string_view>

namespace fsdpp {

// The length of the valid UTF-8 character that starts text, or 0 when none does (text empty, an invalid byte, a
// truncated sequence).
std::size_t utf8_char_length(std::string_view text);
// The length of the longest prefix of `text` that is valid UTF-8 (cut before an incomplete last character).
std::size_t valid_utf8_length(std::string_view text);
// The length of the run of bytes at the start of `text` that starts no valid UTF-8 character.
std::size_t invalid_utf8_length(std::string_view text);
// Appends the UTF-8 of code point `c` (at most U+10FFFF).
void append_utf8(std::string& out, char32_t c);

}  // namespace fsdpp
