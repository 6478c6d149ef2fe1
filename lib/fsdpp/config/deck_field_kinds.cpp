#include "fsdpp/config/deck_field_kinds.hpp"

#include <yaml-cpp/yaml.h>

namespace fsdpp::deck_detail {

[[noreturn]] void fail(const std::string& where, const std::string& what) { throw UsageError(where + ": " + what); }

std::string scalar_or_fail(const YAML::Node& value, const std::string& where, const std::string& expected) {
  if (is_null_value(value) || !value.IsScalar())
    fail(where, fmt::format("expected {}, got {}", expected, describe_node(value)));
  return value.Scalar();
}

Field base(std::string_view path, std::string doc) {
  Field f;
  const auto dot = path.find('.');
  f.section = std::string(path.substr(0, dot));
  f.key = std::string(path.substr(dot + 1));
  f.doc = std::move(doc);
  return f;
}

std::string int_range_text(std::int64_t lo, std::int64_t hi) {
  return hi == kNoMax ? fmt::format(">= {}", lo) : fmt::format("in [{}, {}]", lo, hi);
}

std::int64_t read_int(const YAML::Node& value, const std::string& where, std::int64_t lo, std::int64_t hi,
                      const std::string& range) {
  const std::string text = scalar_or_fail(value, where, "an integer");
  const IntText n = parse_integer(text);
  if (!n.is_integer) fail(where, fmt::format("expected an integer, got '{}'", text));
  if (n.overflow || n.value > hi)
    fail(where, fmt::format("expected an integer {}, got {}", int_range_text(lo, hi), text));
  if (n.value < lo) fail(where, fmt::format("expected an integer {}, got {}", range, text));
  return n.value;
}

}  // namespace fsdpp::deck_detail
