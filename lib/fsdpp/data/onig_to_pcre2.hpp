#pragma once
// Oniguruma expressions (ONIG_SYNTAX_ONIGURUMA on UTF-8: how Hugging Face `tokenizers` compiles a tokenizer.json's
// Split regex) rewritten as PCRE2 expressions (UTF + UCP) that match the same text in the same way, so that the
// pre-tokenizer runs on PCRE2's JIT (about three times Oniguruma's speed on these expressions). Rewritten where the
// two engines read the same text differently:
//   X{n,m}+  X{n}+  X{n}?   -> (?:X{n,m})+ ... : Oniguruma repeats the interval again; PCRE2 would read possessive
//                              or lazy (cl100k_base's \p{N}{1,3}+ makes one piece of a digit run, then BPE splits it)
//   X{,m}                   -> X{0,m}
//   \s \S                   -> [\t-\r\x{85}\p{Z}] and its complement: Unicode White_Space (PCRE2's \s also takes
//                              U+180E, the Mongolian vowel separator, a space before Unicode 6.3)
//   \d \D                   -> \p{Nd} \P{Nd};  \v -> \x{0B};  \uHHHH -> \x{HHHH};  . -> [^\n]
//   ^ $                     -> (?<![^\n]) (?![^\n]): start / end of a line, as Oniguruma's anchors always are
//   [a[bc]]                 -> [abc]: a class nested in a class is a union (BLOOM's expression), not a literal '['
//   (...) (?<name>...)      -> (?:...): a Split uses only the whole match
// Only constructs whose meaning is known in both engines are translated; anything else (\w, \b, \h, scripts in \p,
// POSIX brackets, &&, back-references, non-ASCII text or \p under (?i), case-folding letter pairs like "ss" under
// (?i), ...) is reported, and the caller matches with Oniguruma itself. tests/unit/test_tokenizer.cpp runs the
// expressions of real tokenizer.json files through both engines on every code point and compares the pieces.
#include <string>
#include <string_view>

namespace fsdpp {

struct Pcre2Translation {
  std::string pattern;  // the PCRE2 expression (when `refused` is empty)
  std::string refused;  // why the expression is not translated ("\w (not translated) at offset 3"), or empty
};

Pcre2Translation pcre2_from_oniguruma(std::string_view pattern);

}  // namespace fsdpp
