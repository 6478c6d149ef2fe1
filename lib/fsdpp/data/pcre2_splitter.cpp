#include "fsdpp/data/pcre2_splitter.hpp"

#include "fsdpp/runtime/error.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace fsdpp {
namespace {

constexpr std::size_t kJitStackBytes = std::size_t{1} << 20;  // long whitespace runs backtrack deeply

pcre2_code* code_of(void* p) { return static_cast<pcre2_code*>(p); }

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct Pcre2Splitter::Scratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~Scratch() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

Pcre2Splitter::Pcre2Splitter(const std::string& pattern, bool literal, const std::string& origin) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset,
                        nullptr);
  if (!code_)
    throw UsageError(fmt::format("{}: the pre_tokenizer's regular expression '{}' does not compile (PCRE2, at "
                                 "offset {}): {}",
                                 origin, pattern, offset, pcre2_message(error)));
  jit_ = pcre2_jit_compile(code_of(code_), PCRE2_JIT_COMPLETE) == 0;
}

Pcre2Splitter::~Pcre2Splitter() { pcre2_code_free(code_of(code_)); }

void Pcre2Splitter::ScratchDeleter::operator()(Scratch* s) const { delete s; }

Pcre2Splitter::ScratchPtr Pcre2Splitter::scratch() const {
  ScratchPtr s(new Scratch);
  s->data = pcre2_match_data_create_from_pattern(code_of(code_), nullptr);
  s->context = pcre2_match_context_create(nullptr);
  if (jit_) {
    s->stack = pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr);
    pcre2_jit_stack_assign(s->context, nullptr, s->stack);
  }
  FSDPP_CHECK(s->data && s->context && (!jit_ || s->stack), "out of memory for PCRE2 match data");
  return s;
}

void Pcre2Splitter::split(std::string_view subject, std::size_t begin, std::size_t end, Scratch& scratch,
                          std::vector<std::pair<std::size_t, std::size_t>>& pieces) const {
  const auto* text = reinterpret_cast<PCRE2_SPTR>(subject.data());
  std::size_t at = begin, gap = begin;
  while (at < end) {
    const int rc = pcre2_match(code_of(code_), text, subject.size(), at, 0, scratch.data, scratch.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0)
      throw Error(fmt::format("PCRE2 failed on a pre-tokenization piece at byte {}: {}", at, pcre2_message(rc)));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
    const std::size_t m_begin = ovector[0], m_end = std::min<std::size_t>(ovector[1], end);
    if (m_begin >= end) break;
    if (m_end == m_begin) {  // an empty match splits nothing; step over one UTF-8 character
      at = m_begin + 1;
      while (at < end && (static_cast<unsigned char>(subject[at]) & 0xC0) == 0x80) ++at;
      continue;
    }
    if (m_begin > gap) pieces.emplace_back(gap, m_begin);
    pieces.emplace_back(m_begin, m_end);
    gap = at = m_end;
  }
  if (gap < end) pieces.emplace_back(gap, end);
}

}  // namespace fsdpp
