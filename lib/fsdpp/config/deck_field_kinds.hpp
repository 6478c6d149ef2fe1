#pragma once
// Internal to the deck layer: the kinds of deck key (integer, number, boolean, string, choice) that the key table
// (deck_schema.cpp) is built from, each with its parsing, range check, error text and echo (helpers in
// deck_field_kinds.cpp), and the keys whose values have a shape of their own (deck_composite_fields.cpp). yaml-cpp
// stays out of this header, as out of deck_schema.hpp: the kinds only pass nodes on to the helpers. Written once
// here so that every key of a kind reads, checks and reports alike.
#include "fsdpp/config/deck_schema.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpp::deck_detail {

inline constexpr std::int64_t kNoMax = std::numeric_limits<std::int64_t>::max();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A UsageError "<where>: <what>".
[[noreturn]] void fail(const std::string& where, const std::string& what);
// The scalar text of `value`, or an error naming what was expected instead.
std::string scalar_or_fail(const YAML::Node& value, const std::string& where, const std::string& expected);
// A field with its section, key and meaning; the kind fills in the rest.
Field base(std::string_view path, std::string doc);
std::string int_range_text(std::int64_t lo, std::int64_t hi);  // ">= 1" or "in [1, 8]"
// `range` names the allowed values as the help does (">= 1"); a value beyond the member's own limit gets the
// full interval instead, since ">= 1, got 3000000000" would read as nonsense.
std::int64_t read_int(const YAML::Node& value, const std::string& where, std::int64_t lo, std::int64_t hi,
                      const std::string& range);

template <class Sec, class T>
Field integer(std::string_view path, Sec Deck::*sec, T Sec::*member, std::int64_t lo, std::string doc,
              std::int64_t hi = kNoMax) {
  // The member's own limit bounds the value but is not worth naming ("integer >= 1", not "in [1, 2147483647]").
  const auto type_max = static_cast<std::int64_t>(
      std::min<std::uint64_t>(std::numeric_limits<T>::max(), std::numeric_limits<std::int64_t>::max()));
  const std::string range = int_range_text(lo, hi < type_max ? hi : kNoMax);
  hi = std::min(hi, type_max);
  Field f = base(path, std::move(doc));
  f.type = "integer " + range;
  f.set = [=](Deck& d, const YAML::Node& v, const std::string& where) {
    (d.*sec).*member = static_cast<T>(read_int(v, where, lo, hi, range));
  };
  f.get = [=](const Deck& d) { return fmt::format("{}", (d.*sec).*member); };
  return f;
}

struct RealRange {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  std::string text() const {
    if (hi == kInf) return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
    return fmt::format("in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
  }
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};
inline const RealRange kPositive{0.0, kInf, true, false};
inline const RealRange kNonNegative{0.0, kInf, false, false};
inline const RealRange kUnitHalfOpen{0.0, 1.0, false, true};

template <class Sec>
Field real(std::string_view path, Sec Deck::*sec, double Sec::*member, RealRange range, std::string doc) {
  Field f = base(path, std::move(doc));
  f.type = "number " + range.text();
  f.set = [=](Deck& d, const YAML::Node& v, const std::string& where) {
    const std::string text = scalar_or_fail(v, where, "a number");
    double x = 0;
    if (!parse_real(text, x)) fail(where, fmt::format("expected a number, got '{}'", text));
    if (!range.contains(x)) fail(where, fmt::format("expected a number {}, got {}", range.text(), text));
    (d.*sec).*member = x;
  };
  f.get = [=](const Deck& d) { return format_real((d.*sec).*member); };
  return f;
}

template <class Sec> Field boolean(std::string_view path, Sec Deck::*sec, bool Sec::*member, std::string doc) {
  Field f = base(path, std::move(doc));
  f.type = "true|false";
  f.set = [=](Deck& d, const YAML::Node& v, const std::string& where) {
    const std::string text = scalar_or_fail(v, where, "true or false");
    bool b = false;
    if (!parse_bool(text, b)) fail(where, fmt::format("expected true or false, got '{}'", text));
    (d.*sec).*member = b;
  };
  f.get = [=](const Deck& d) { return std::string((d.*sec).*member ? "true" : "false"); };
  return f;
}

// A path or name: any non-empty text; `no_slash` for names that become one folder level.
template <class Sec>
Field text(std::string_view path, Sec Deck::*sec, std::string Sec::*member, std::string doc, bool no_slash = false) {
  Field f = base(path, std::move(doc));
  f.type = "string";
  f.set = [=](Deck& d, const YAML::Node& v, const std::string& where) {
    const std::string s = scalar_or_fail(v, where, "a string");
    if (s.empty()) fail(where, "expected a non-empty string, got ''");
    if (no_slash && s.find('/') != std::string::npos)
      fail(where, fmt::format("expected a name without '/', got '{}'", s));
    (d.*sec).*member = s;
  };
  f.get = [=](const Deck& d) { return yaml_scalar((d.*sec).*member); };
  return f;
}

template <class E> std::string enum_choices(const EnumNames<E>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : "|") + std::string(n.name);
  return out;
}

template <class E> E read_enum(const YAML::Node& v, const std::string& where, const EnumNames<E>& names) {
  const std::string choices = enum_choices(names);
  const std::string s = scalar_or_fail(v, where, choices);
  std::vector<std::string> candidates;
  for (const auto& n : names) {
    if (n.name == s) return n.value;
    candidates.emplace_back(n.name);
  }
  const std::string hint = closest(s, candidates);
  fail(where, fmt::format("expected {}, got '{}'{}", choices, s,
                          hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", hint)));
}

template <class Sec, class E>
Field choice(std::string_view path, Sec Deck::*sec, E Sec::*member, const EnumNames<E>& names, std::string doc) {
  Field f = base(path, std::move(doc));
  f.type = enum_choices(names);
  f.set = [=, &names](Deck& d, const YAML::Node& v, const std::string& where) {
    (d.*sec).*member = read_enum(v, where, names);
  };
  f.get = [=, &names](const Deck& d) { return std::string(name_of(names, (d.*sec).*member)); };
  return f;
}

// ---- keys with values of their own shape (deck_composite_fields.cpp) ----

Field reshard_after_forward();   // fsdp.reshard_after_forward: true|false|N
Field trace_steps();             // run.trace: N or FIRST-LAST
Field prefetch(std::string_view path, PrefetchSetting FsdpConfig::*member, std::string doc);  // fsdp.*_prefetch
Field activation_checkpointing();  // train.activation_checkpointing
Field resume();                  // checkpoint.resume: a boolean, auto, none or a file
Field init_from();               // checkpoint.init_from: none or weights
Field mesh_dim(std::string_view path, int MeshConfig::*member, std::string doc);  // -1 (inferred) or a size
Field llama_only(Field f, std::string default_doc);  // a key only the Llama family reads
Field data_sources();            // data.sources: a list of {path, weight}
Field pipeline_split();          // pipeline.split: a list of block indices
std::vector<Field> moe_fields();  // model.moe.*: the mixture-of-experts keys

}  // namespace fsdpp::deck_detail
