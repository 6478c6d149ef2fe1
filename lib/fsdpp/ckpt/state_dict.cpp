#include "fsdpp/ckpt/state_dict.hpp"

#include "fsdpp/runtime/error.hpp"

#include <algorithm>

namespace fsdpp {

void StateDict::set(const std::string& key, StateScalar value) {
  for (auto& [k, v] : scalars)
    if (k == key) {
      v = value;
      return;
    }
  scalars.emplace_back(key, value);
}

std::vector<std::pair<std::string, std::string>> scalars_as_text(const StateScalars& scalars) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, value] : scalars) {
    if (const double* d = std::get_if<double>(&value)) out.emplace_back(key, fmt::format("{:.17g}", *d));
    else std::visit([&, &key = key](auto v) { out.emplace_back(key, fmt::format("{}", v)); }, value);
  }
  std::sort(out.begin(), out.end());
  return out;
}

template <class T> T StateDict::get(const std::string& key) const {
  for (const auto& [k, v] : scalars)
    if (k == key) {
      const T* value = std::get_if<T>(&v);
      FSDPP_REQUIRE(value, "checkpoint state '{}' has another type than the one this part of training saves", key);
      return *value;
    }
  throw UsageError(fmt::format("checkpoint state '{}' is missing: the checkpoint was written by a version of fsdpp "
                               "that did not save it", key));
}

template std::int64_t StateDict::get<std::int64_t>(const std::string&) const;
template std::uint64_t StateDict::get<std::uint64_t>(const std::string&) const;
template double StateDict::get<double>(const std::string&) const;

}  // namespace fsdpp
