#pragma once
// Finiteness of tensor data: weights with a NaN or an infinity are refused on import, init_from and load,
// and reported by fsdpp ckpt verify, naming the tensor and the first bad element.
#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

// The index of the first NaN or infinity in data[0, count), if any.
inline std::optional<std::size_t> first_non_finite(const float* data, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i)
    if (!std::isfinite(data[i])) return i;
  return std::nullopt;
}

// "element 17 ([1, 7]) is nan": the flat index within a tensor of `shape` (row-major) and its value.
inline std::string describe_non_finite(std::size_t flat, const std::vector<std::int64_t>& shape, float value) {
  std::vector<std::int64_t> index(shape.size(), 0);
  std::size_t rest = flat;
  for (std::size_t d = shape.size(); d-- > 0;) {
    const auto extent = static_cast<std::size_t>(shape[d] > 0 ? shape[d] : 1);
    index[d] = static_cast<std::int64_t>(rest % extent);
    rest /= extent;
  }
  std::string where;
  for (std::size_t d = 0; d < index.size(); ++d) where += fmt::format("{}{}", d ? ", " : "", index[d]);
  return fmt::format("element {} ([{}]) is {}", flat, where, std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf");
}

}  // namespace fsdpp
