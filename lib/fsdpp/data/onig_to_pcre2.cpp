#include "fsdpp/data/onig_to_pcre2.hpp"

#include "fsdpp/data/utf8.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>

namespace fsdpp {
namespace {

// Unicode White_Space, which Oniguruma's \s is: tab..carriage return, U+0085 and the separators (Z, space included);
// not U+180E, which PCRE2's \s still takes.
constexpr const char* kSpaceItems = "\\t-\\r\\x{85}\\p{Z}";
// General categories (short names): their sets follow the Unicode data of each library, the same in both.
constexpr std::array<const char*, 35> kUnicodeCategories = {
    "L",  "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N",  "Nd", "Nl", "No", "P",  "Pc", "Pd", "Ps",
    "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk", "So", "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Co"};

bool ascii_alnum(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }
char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

std::string code_point(std::uint32_t cp) { return fmt::format("\\x{{{:X}}}", cp); }

// A character outside a class, as PCRE2 reads it best (its JIT is ~10% slower on \x{...} and bracketed properties):
// letters, digits and other characters as they are, ASCII punctuation escaped, control characters by code.
std::string literal_text(std::uint32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return code_point(cp);
  if (cp < 0x80 && !ascii_alnum(static_cast<char>(cp)) && cp != ' ') return std::string{'\\', static_cast<char>(cp)};
  std::string utf8;
  append_utf8(utf8, cp);
  return utf8;
}

class Translator {
 public:
  explicit Translator(std::string_view pattern) : p_(pattern) {}

  Pcre2Translation run() {
    try {
      alternation(false);
    } catch (const Refusal& r) {
      return {"", r.why};
    }
    return {out_, ""};
  }

 private:
  struct Refusal {
    std::string why;
  };
  struct ClassAtom {
    bool is_char = false;  // a single character (a range may start or end at it), else a set
    std::uint32_t cp = 0;
    std::string text;  // inside PCRE2 brackets
  };

  [[noreturn]] void refuse(const std::string& what) const {
    throw Refusal{fmt::format("{} at offset {}", what, i_)};
  }
  bool at_end() const { return i_ >= p_.size(); }
  char peek(std::size_t k = 0) const { return i_ + k < p_.size() ? p_[i_ + k] : '\0'; }

  // alternatives up to the end, or to the ')' of the group they are in
  void alternation(bool in_group) {
    const bool case_insensitive = ci_;
    for (;;) {
      sequence();
      if (at_end()) {
        if (in_group) refuse("a group without ')'");
        break;
      }
      if (peek() == ')') {
        if (!in_group) refuse("an unmatched ')'");
        break;
      }
      out_ += '|';  // peek() == '|'
      ++i_;
      previous_literal_ = '\0';
    }
    ci_ = case_insensitive;
  }

  void sequence() {
    while (!at_end() && peek() != '|' && peek() != ')') {
      const std::size_t atom_start = out_.size();
      const bool quantifiable = atom();
      quantifiers(atom_start, quantifiable);
    }
  }

  // One atom; returns whether a quantifier may follow it.
  bool atom() {
    const char c = peek();
    if (c != '\\' && !(c & 0x80) && !std::isalpha(static_cast<unsigned char>(c))) previous_literal_ = '\0';
    switch (c) {
      case '(':
        return group();
      case '[':
        char_class();
        return true;
      case '.':
        ++i_;
        out_ += "[^\\n]";
        return true;
      case '^':
        ++i_;
        out_ += "(?<![^\\n])";
        return false;
      case '$':
        ++i_;
        out_ += "(?![^\\n])";
        return false;
      case '\\':
        return escape();
      case '?':
      case '*':
      case '+':
      case '{':
        refuse("a quantifier with nothing to repeat, or a literal '{'");
      case ']':
      case '}':
        ++i_;
        out_ += '\\';
        out_ += c;
        return true;
      default:
        literal();
        return true;
    }
  }

  // A plain character. Under (?i) only ASCII, and no pair that a character folds to ("ss" is ß to Oniguruma).
  void literal() {
    const std::uint32_t cp = utf8_char();
    if (ci_) {
      if (cp >= 0x80) refuse("a non-ASCII character under (?i)");
      const char c = lower(static_cast<char>(cp));
      static constexpr std::array<const char*, 5> kFoldedPairs = {"ss", "st", "ff", "fi", "fl"};
      const char pair[3] = {previous_literal_, c, '\0'};
      for (const char* folded : kFoldedPairs)
        if (std::string_view(pair) == folded) refuse(fmt::format("'{}' under (?i) (a character folds to it)", pair));
      previous_literal_ = std::isalpha(static_cast<unsigned char>(c)) ? c : '\0';
    }
    out_ += literal_text(cp);
  }

  std::uint32_t utf8_char() {
    const auto b = static_cast<unsigned char>(p_[i_]);
    const int n = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
    std::uint32_t cp = n == 1 ? b : b & (0x7F >> n);
    if (i_ + n > p_.size()) refuse("a truncated UTF-8 character");
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(p_[i_ + k]) & 0x3F);
    i_ += n;
    return cp;
  }

  bool escape() {
    ++i_;
    if (at_end()) refuse("a trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'A':
      case 'z':
      case 'Z':
        out_ += '\\';
        out_ += c;
        return false;
      case 'S':
        out_ += fmt::format("[^{}]", kSpaceItems);
        return true;
      default: {
        const ClassAtom a = escaped_item(c);
        if (a.is_char && ci_ && a.cp >= 0x80) refuse("a non-ASCII character under (?i)");
        const bool one_property = a.text.rfind("\\p{", 0) == 0 || a.text.rfind("\\P{", 0) == 0;
        out_ += a.is_char ? literal_text(a.cp) : one_property ? a.text : "[" + a.text + "]";
        return true;
      }
    }
  }

  // The escape after '\' (already read: c) that may stand in a class too.
  ClassAtom escaped_item(char c) {
    ClassAtom a;
    switch (c) {
      case 'p':
      case 'P':
        a.text = property(c == 'P');
        return a;
      case 's':
        a.text = kSpaceItems;
        return a;
      case 'd':
        a.text = "\\p{Nd}";
        return a;
      case 'D':
        a.text = "\\P{Nd}";
        return a;
      case 'n': a.cp = 0x0A; break;
      case 't': a.cp = 0x09; break;
      case 'r': a.cp = 0x0D; break;
      case 'f': a.cp = 0x0C; break;
      case 'v': a.cp = 0x0B; break;
      case 'a': a.cp = 0x07; break;
      case 'e': a.cp = 0x1B; break;
      case 'x': a.cp = hex(peek() == '{' ? 8 : 2, peek() == '{'); break;
      case 'u': a.cp = hex(4, false); break;
      default:
        if (ascii_alnum(c)) refuse(fmt::format("\\{} (not translated)", c));
        if (c & 0x80) refuse("an escaped non-ASCII character");
        a.cp = static_cast<unsigned char>(c);  // escaped punctuation stands for itself
    }
    a.is_char = true;
    a.text = code_point(a.cp);
    return a;
  }

  // \xHH (one byte to Oniguruma: only ASCII means a character), \x{H...}, \uHHHH.
  std::uint32_t hex(int max_digits, bool braced) {
    if (braced) ++i_;
    std::uint32_t value = 0;
    int digits = 0;
    while (digits < max_digits && std::isxdigit(static_cast<unsigned char>(peek()))) {
      value = value * 16 + static_cast<std::uint32_t>(std::stoi(std::string(1, peek()), nullptr, 16));
      ++i_, ++digits;
    }
    if (braced) {
      if (peek() != '}') refuse("an unterminated \\x{...}");
      ++i_;
    }
    if (digits == 0 || (max_digits == 4 && digits != 4)) refuse("a malformed hexadecimal escape");
    if (!braced && max_digits == 2 && value >= 0x80) refuse("\\xHH past 7F (a byte, not a character, to Oniguruma)");
    if (value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) refuse("a code point that is not a character");
    return value;
  }

  // \p{Name} or \p{^Name} (after "\p" or "\P"): general categories only.
  std::string property(bool negated) {
    if (peek() != '{') refuse("\\p without {...}");
    ++i_;
    if (peek() == '^') negated = !negated, ++i_;
    std::string name;
    while (!at_end() && peek() != '}') {
      const char c = p_[i_++];
      if (c != ' ' && c != '_' && c != '-') name += lower(c);  // Oniguruma's loose matching of names
    }
    if (at_end()) refuse("an unterminated \\p{...}");
    ++i_;
    if (ci_) refuse("\\p under (?i)");
    const auto* match = std::find_if(kUnicodeCategories.begin(), kUnicodeCategories.end(), [&](const char* category) {
      std::string folded(category);
      for (char& ch : folded) ch = lower(ch);
      return folded == name;
    });
    if (match == kUnicodeCategories.end()) refuse(fmt::format("\\p{{{}}} (only general categories are translated)", name));
    return fmt::format("\\{}{{{}}}", negated ? 'P' : 'p', *match);
  }

  void char_class() {
    ++i_;
    const bool negated = peek() == '^';
    if (negated) ++i_;
    std::string body;
    class_items(body);
    out_ += negated ? "[^" : "[";
    out_ += body;
    out_ += ']';
  }

  // Items up to the class's ']'; a nested class adds its items (a union).
  void class_items(std::string& body) {
    if (peek() == ']') refuse("a ']' first in a class");
    for (;;) {
      if (at_end()) refuse("a class without ']'");
      const char c = peek();
      if (c == ']') {
        ++i_;
        return;
      }
      if (c == '[') {
        if (peek(1) == ':') refuse("a POSIX bracket");
        if (peek(1) == '^') refuse("a negated class inside a class");
        ++i_;
        class_items(body);
        continue;
      }
      if (c == '&' && peek(1) == '&') refuse("a class intersection (&&)");
      const ClassAtom first = class_atom();
      if (first.is_char && peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
        ++i_;
        if (peek() == '[') refuse("a range ending in a class");
        const ClassAtom last = class_atom();
        if (!last.is_char) refuse("a range ending in a class escape");
        body += first.text + "-" + last.text;
      } else {
        body += first.text;
      }
    }
  }

  ClassAtom class_atom() {
    ClassAtom a;
    if (peek() == '\\') {
      ++i_;
      if (at_end()) refuse("a trailing backslash");
      const char c = p_[i_++];
      if (c == 'S' || c == 'b') refuse(fmt::format("\\{} in a class", c));  // no union of a complement in PCRE2
      a = escaped_item(c);
    } else {
      a.is_char = true;
      a.cp = utf8_char();
      a.text = code_point(a.cp);
    }
    if (ci_ && (!a.is_char || a.cp >= 0x80)) refuse("a non-ASCII or property class item under (?i)");
    return a;
  }

  // Returns whether a quantifier may follow the group.
  bool group() {
    ++i_;
    bool quantifiable = true;
    const bool case_insensitive = ci_;
    if (peek() != '?') {
      out_ += "(?:";  // a capture: a Split uses only the whole match
    } else {
      ++i_;
      const char c = peek();
      if (c == ':' || c == '>') {
        out_ += "(?";
        out_ += c;
        ++i_;
      } else if (c == '=' || c == '!') {
        out_ += "(?";
        out_ += c;
        ++i_;
        quantifiable = false;
      } else if (c == '<' && (peek(1) == '=' || peek(1) == '!')) {
        out_ += "(?<";
        out_ += peek(1);
        i_ += 2;
        quantifiable = false;
      } else if (c == '<' || c == '\'') {
        const char close = c == '<' ? '>' : '\'';
        while (!at_end() && peek() != close) ++i_;
        if (at_end()) refuse("an unterminated group name");
        ++i_;
        out_ += "(?:";
      } else if (c == 'i' || c == '-') {
        const bool on = c == 'i';
        i_ += on ? 1 : 2;
        if (!on && p_[i_ - 1] != 'i') refuse("an option other than i");
        if (peek() == ')') {  // (?i) to the end of the enclosing group: the same only where nothing precedes it
          if (!out_.empty() || in_group_depth_ > 0) refuse("(?i) after the start of the expression");
          ++i_;
          ci_ = on;
          out_ += on ? "(?i)" : "(?-i)";
          return false;
        }
        if (peek() != ':') refuse("an option other than i");
        ++i_;
        ci_ = on;
        out_ += on ? "(?i:" : "(?-i:";
      } else {
        refuse(fmt::format("the group (?{} (not translated)", c));
      }
    }
    ++in_group_depth_;
    previous_literal_ = '\0';
    alternation(true);
    --in_group_depth_;
    ++i_;  // ')'
    out_ += ')';
    ci_ = case_insensitive;
    previous_literal_ = '\0';
    return quantifiable;
  }

  // Quantifiers after the atom that starts at out_[atom_start]. Oniguruma reads a '?' or '+' after ?, * or + as
  // lazy or possessive, a '?' after {n,m} as lazy; after an interval, anything else (and '?' after {n}) is one
  // more repetition of the repeated atom.
  void quantifiers(std::size_t atom_start, bool quantifiable) {
    for (int count = 0;; ++count) {
      std::string q;
      bool interval_q = false, fixed = false;
      const char c = peek();
      if (c == '?' || c == '*' || c == '+') {
        q = c;
        ++i_;
      } else if (c == '{' && interval(q, fixed)) {
        interval_q = true;
      } else {
        return;
      }
      if (!quantifiable) refuse("a quantifier after an anchor or a look-around");
      if (count == 1) {
        if (!previous_was_interval_) refuse("a quantifier after a quantifier other than an interval");
        out_.insert(atom_start, "(?:");
        out_ += ')';
      } else if (count == 2) {
        refuse("three quantifiers in a row");
      }
      if (!interval_q && (peek() == '?' || peek() == '+')) {
        q += peek();
        ++i_;
      } else if (interval_q && !fixed && peek() == '?') {
        q += '?';
        ++i_;
      }
      out_ += q;
      previous_was_interval_ = interval_q && q.back() == '}';
    }
  }

  // {n} {n,} {n,m} {,m} at i_ (then consumed); false (nothing consumed) when '{' does not start one.
  bool interval(std::string& q, bool& fixed) {
    std::size_t j = i_ + 1;
    auto number = [&](std::string& digits) {
      while (j < p_.size() && std::isdigit(static_cast<unsigned char>(p_[j]))) digits += p_[j++];
    };
    std::string low, high;
    number(low);
    const bool comma = j < p_.size() && p_[j] == ',';
    if (comma) ++j, number(high);
    if (j >= p_.size() || p_[j] != '}' || (low.empty() && high.empty())) return false;
    for (const std::string* n : {&low, &high})
      if (n->size() > 5 || (!n->empty() && std::stoi(*n) > 65535)) refuse("a repetition count past 65535");
    i_ = j + 1;
    fixed = !comma;
    q = comma ? fmt::format("{{{},{}}}", low.empty() ? "0" : low, high) : fmt::format("{{{}}}", low);
    return true;
  }

  std::string_view p_;
  std::size_t i_ = 0;
  std::string out_;
  bool ci_ = false;                  // under (?i)
  char previous_literal_ = '\0';     // the ASCII letter before, under (?i) (folded pairs)
  bool previous_was_interval_ = false;
  int in_group_depth_ = 0;
};

}  // namespace

Pcre2Translation pcre2_from_oniguruma(std::string_view pattern) { return Translator(pattern).run(); }

}  // namespace fsdpp
