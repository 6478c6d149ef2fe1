#include "fsdpp/data/regex_splitter.hpp"

#include "fsdpp/data/onig_to_pcre2.hpp"
#include "fsdpp/data/utf8.hpp"
#include "fsdpp/runtime/error.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <oniguruma.h>
#include <pcre2.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace fsdpp {
namespace {

constexpr std::size_t kJitStackBytes = std::size_t{1} << 20;  // long whitespace runs backtrack deeply

regex_t* regex_of(void* p) { return static_cast<regex_t*>(p); }
pcre2_code* code_of(void* p) { return static_cast<pcre2_code*>(p); }
const UChar* bytes(const char* p) { return reinterpret_cast<const UChar*>(p); }

// onig_initialize once per process, for UTF-8 (as the Rust onig crate does before its first expression).
void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

std::string onig_message(int code, OnigErrorInfo* info) {
  UChar buffer[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int n = info ? onig_error_code_to_str(buffer, code, info) : onig_error_code_to_str(buffer, code);
  return std::string(reinterpret_cast<const char*>(buffer), n > 0 ? static_cast<std::size_t>(n) : 0);
}

// The PCRE2 program for `pattern` (UTF + UCP, '\n' the only newline), or null when PCRE2 refuses it.
pcre2_code* compile_pcre2(const std::string& pattern, bool literal) {
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  FSDPP_CHECK(context, "out of memory for a PCRE2 compile context");
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
                                   &offset, context);
  pcre2_compile_context_free(context);
  return code;
}

}  // namespace

struct RegexSplitter::Scratch {
  OnigRegion* region = nullptr;
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ~Scratch() {
    onig_region_free(region, 1);
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

RegexSplitter::RegexSplitter(const std::string& pattern, bool literal, const std::string& origin)
    : RegexSplitter(pattern, literal, origin, Engine::pcre2) {}

RegexSplitter::RegexSplitter(const std::string& pattern, bool literal, const std::string& origin, Engine engine) {
  initialize_oniguruma();
  OnigErrorInfo info{};
  regex_t* regex = nullptr;
  // A {"String": ...} pattern is matched as is (tokenizers escapes it into an expression of the same meaning).
  const int rc = onig_new(&regex, bytes(pattern.data()), bytes(pattern.data() + pattern.size()), ONIG_OPTION_NONE,
                          ONIG_ENCODING_UTF8, literal ? ONIG_SYNTAX_ASIS : ONIG_SYNTAX_ONIGURUMA, &info);
  if (rc != ONIG_NORMAL)
    throw UsageError(fmt::format("{}: the pre_tokenizer's regular expression '{}' does not compile (Oniguruma, the "
                                 "engine of Hugging Face tokenizers): {}",
                                 origin, pattern, onig_message(rc, &info)));
  onig_ = regex;
  if (engine == Engine::oniguruma) {
    untranslated_ = "Oniguruma requested";
    return;
  }
  const Pcre2Translation translation =
      literal ? Pcre2Translation{pattern, ""} : pcre2_from_oniguruma(pattern);
  untranslated_ = translation.refused;
  if (!untranslated_.empty()) return;
  pcre2_ = compile_pcre2(translation.pattern, literal);
  if (!pcre2_) {  // e.g. a look-behind PCRE2 does not take: Oniguruma matches it
    untranslated_ = "PCRE2 does not compile its translation";
    return;
  }
  jit_ = pcre2_jit_compile(code_of(pcre2_), PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::~RegexSplitter() {
  onig_free(regex_of(onig_));
  pcre2_code_free(code_of(pcre2_));
}

void RegexSplitter::ScratchDeleter::operator()(Scratch* s) const { delete s; }

RegexSplitter::ScratchPtr RegexSplitter::scratch() const {
  ScratchPtr s(new Scratch);
  s->region = onig_region_new();
  FSDPP_CHECK(s->region, "out of memory for an Oniguruma match region");
  if (pcre2_) {
    s->data = pcre2_match_data_create_from_pattern(code_of(pcre2_), nullptr);
    s->context = pcre2_match_context_create(nullptr);
    if (jit_) {
      s->stack = pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr);
      pcre2_jit_stack_assign(s->context, nullptr, s->stack);
    }
    FSDPP_CHECK(s->data && s->context && (!jit_ || s->stack), "out of memory for PCRE2 match data");
  }
  return s;
}

bool RegexSplitter::find_oniguruma(std::string_view subject, std::size_t start, Scratch& scratch,
                                   std::size_t& begin, std::size_t& end) const {
  const UChar* text = bytes(subject.data());
  const int rc = onig_search(regex_of(onig_), text, text + subject.size(), text + start, text + subject.size(),
                             scratch.region, ONIG_OPTION_NONE);
  if (rc == ONIG_MISMATCH) return false;
  if (rc < 0)
    throw Error(fmt::format("Oniguruma failed on a pre-tokenization piece at byte {}: {}", start,
                            onig_message(rc, nullptr)));
  begin = static_cast<std::size_t>(scratch.region->beg[0]);
  end = static_cast<std::size_t>(scratch.region->end[0]);
  return true;
}

bool RegexSplitter::find(std::string_view subject, std::size_t start, Scratch& scratch, std::size_t& begin,
                         std::size_t& end) const {
  if (!pcre2_) return find_oniguruma(subject, start, scratch, begin, end);
  // The subject is valid UTF-8 (checked by the caller), so PCRE2 need not check it again on every call.
  const int rc = pcre2_match(code_of(pcre2_), reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), start,
                             PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  // Out of JIT stack or match limits on a pathological piece: the same match, found by Oniguruma.
  if (rc < 0) return find_oniguruma(subject, start, scratch, begin, end);
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
  begin = ovector[0], end = ovector[1];
  return true;
}

void RegexSplitter::split(std::string_view subject, std::size_t begin, std::size_t end, Scratch& scratch,
                          std::vector<std::pair<std::size_t, std::size_t>>& pieces) const {
  // onig's find_iter: search from last_end; an empty match that ends where the previous match ended is skipped
  // by moving last_end one character on. Matches split the text; empty ones yield no piece but split the gap.
  std::size_t last_end = begin, gap = begin;
  bool matched = false;
  std::size_t last_match_end = 0;
  while (last_end <= end) {
    std::size_t m_begin = 0, m_end = 0;
    if (!find(subject, last_end, scratch, m_begin, m_end) || m_begin >= end) break;
    m_end = std::min(m_end, end);
    if (m_begin == m_end && matched && last_match_end == m_end) {
      const std::size_t step = last_end < subject.size() ? utf8_char_length(subject.substr(last_end)) : 0;
      last_end += std::max<std::size_t>(step, 1);
      continue;
    }
    last_end = last_match_end = m_end;
    matched = true;
    if (m_begin > gap) pieces.emplace_back(gap, m_begin);
    if (m_end > m_begin) pieces.emplace_back(m_begin, m_end);
    gap = m_end;
  }
  if (gap < end) pieces.emplace_back(gap, end);
}

}  // namespace fsdpp
