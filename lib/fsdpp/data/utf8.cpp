#include "fsdpp/data/utf8.hpp"

#include <cstdint>
#include <cstring>

namespace fsdpp {
namespace {

bool continuation(const unsigned char* p, std::size_t left, std::size_t i) { return i < left && (p[i] & 0xC0) == 0x80; }

// utf8_char_length on p[0, left), inlined where it runs over every byte of a corpus.
inline std::size_t char_length(const unsigned char* p, std::size_t left) {
  if (left == 0) return 0;
  const unsigned char b = p[0];
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return continuation(p, left, 1) ? 2 : 0;
  if (b >= 0xE0 && b <= 0xEF) {
    if (!continuation(p, left, 1) || !continuation(p, left, 2)) return 0;
    if ((b == 0xE0 && p[1] < 0xA0) || (b == 0xED && p[1] >= 0xA0)) return 0;  // overlong; surrogate
    return 3;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    if (!continuation(p, left, 1) || !continuation(p, left, 2) || !continuation(p, left, 3)) return 0;
    if ((b == 0xF0 && p[1] < 0x90) || (b == 0xF4 && p[1] >= 0x90)) return 0;  // overlong; past U+10FFFF
    return 4;
  }
  return 0;
}

const unsigned char* bytes(std::string_view text) { return reinterpret_cast<const unsigned char*>(text.data()); }

}  // namespace

std::size_t utf8_char_length(std::string_view text) { return char_length(bytes(text), text.size()); }

std::size_t valid_utf8_length(std::string_view text) {
  const unsigned char* p = bytes(text);
  std::size_t at = 0;
  while (at < text.size()) {
    // Eight ASCII bytes at a time: the common case.
    std::uint64_t eight = 0;
    if (at + 8 <= text.size() && (std::memcpy(&eight, p + at, 8), (eight & 0x8080808080808080ull) == 0)) {
      at += 8;
      continue;
    }
    const std::size_t n = char_length(p + at, text.size() - at);
    if (n == 0) break;
    at += n;
  }
  return at;
}

std::size_t invalid_utf8_length(std::string_view text) {
  std::size_t at = 0;
  while (at < text.size() && char_length(bytes(text) + at, text.size() - at) == 0) ++at;
  return at;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

}  // namespace fsdpp
