#pragma once
// A Hugging Face Split(pattern, "Isolated") step on PCRE2: the matches of the expression and the text between
// them become pieces, in order. UTF + UCP, so \p{L}, \s and friends follow Unicode; invalid UTF-8 never matches
// (it ends up in a between-matches piece). JIT-compiled where PCRE2 has a JIT for this CPU.
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdpp {

class Pcre2Splitter {
 public:
  // `literal`: the pattern is a plain string (Split's {"String": ...}). A pattern PCRE2 refuses is a UsageError
  // naming `origin`, the pattern and PCRE2's message with its offset.
  Pcre2Splitter(const std::string& pattern, bool literal, const std::string& origin);
  ~Pcre2Splitter();
  Pcre2Splitter(const Pcre2Splitter&) = delete;
  Pcre2Splitter& operator=(const Pcre2Splitter&) = delete;

  // Per-thread match state (PCRE2 match data and JIT stack): one per thread that splits.
  struct Scratch;
  struct ScratchDeleter {
    void operator()(Scratch* s) const;
  };
  using ScratchPtr = std::unique_ptr<Scratch, ScratchDeleter>;
  ScratchPtr scratch() const;

  // Appends the pieces of subject[begin, end) as [begin, end) offsets into `subject`. Matches start before
  // `end`; lookahead may read subject past `end` (the text that follows), and a match running past `end` is cut
  // there.
  void split(std::string_view subject, std::size_t begin, std::size_t end, Scratch& scratch,
             std::vector<std::pair<std::size_t, std::size_t>>& pieces) const;

  bool jit() const { return jit_; }

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace fsdpp
