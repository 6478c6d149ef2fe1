#pragma once
// A Hugging Face Split(pattern, "Isolated") step, matched as Python's `tokenizers` matches it: an expression means
// what it means to Oniguruma (the engine `tokenizers` uses, through the Rust onig crate: ONIG_SYNTAX_ONIGURUMA on
// UTF-8), and matches are iterated as onig's find_iter iterates them. The matches and the text between them become
// pieces, in order; an empty match yields no piece but splits the text between matches there, unless it ends where
// the previous match ended (find_iter skips those).
//
// Every expression is compiled by Oniguruma (so one `tokenizers` refuses is refused here, with Oniguruma's message).
// Where onig_to_pcre2.hpp can rewrite it for PCRE2 with the same meaning (the expressions of GPT-2, Llama 3, Qwen2,
// cl100k_base, o200k_base, tekken, DeepSeek, BLOOM), the matching runs on PCRE2's JIT; otherwise on Oniguruma.
// The subject must be valid UTF-8 (utf8.hpp's valid_utf8_length): neither engine is given anything else.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdpp {

class RegexSplitter {
 public:
  enum class Engine { pcre2, oniguruma };

  // `literal`: the pattern is a plain string (Split's {"String": ...}, which `tokenizers` escapes). A pattern
  // Oniguruma refuses is a UsageError naming `origin`, the pattern and Oniguruma's message. `engine`: force one
  // (tests compare the two); by default PCRE2 where the expression translates.
  RegexSplitter(const std::string& pattern, bool literal, const std::string& origin);
  RegexSplitter(const std::string& pattern, bool literal, const std::string& origin, Engine engine);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Per-thread match state (match data, JIT stack, Oniguruma region): one per thread that splits.
  struct Scratch;
  struct ScratchDeleter {
    void operator()(Scratch* s) const;
  };
  using ScratchPtr = std::unique_ptr<Scratch, ScratchDeleter>;
  ScratchPtr scratch() const;

  // Appends the pieces of subject[begin, end) as [begin, end) offsets into `subject` (valid UTF-8 throughout).
  // Matches start before `end`; lookahead and `$` may read subject past `end` (the text that follows), and a match
  // running past `end` is cut there.
  void split(std::string_view subject, std::size_t begin, std::size_t end, Scratch& scratch,
             std::vector<std::pair<std::size_t, std::size_t>>& pieces) const;

  Engine engine() const { return pcre2_ ? Engine::pcre2 : Engine::oniguruma; }
  // Why the expression runs on Oniguruma ("\w (not translated) at offset 3"); empty when it runs on PCRE2.
  const std::string& untranslated() const { return untranslated_; }

 private:
  // The leftmost match at or after `start`: false when there is none.
  bool find(std::string_view subject, std::size_t start, Scratch& scratch, std::size_t& begin,
            std::size_t& end) const;
  bool find_oniguruma(std::string_view subject, std::size_t start, Scratch& scratch, std::size_t& begin,
                      std::size_t& end) const;

  void* onig_ = nullptr;   // regex_t*
  void* pcre2_ = nullptr;  // pcre2_code_8*, when the expression translates
  bool jit_ = false;
  std::string untranslated_;
};

}  // namespace fsdpp
