#pragma once
// Finiteness of tensor data: weights with a NaN or an infinity are refused on import, init_from and load,
// and reported by fsdpp ckpt verify, naming the tensor and the first bad element.
#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

// The index of the first NaN or infinity in data[0, count), if any. Checked a block at a time on the bits (a
// float is NaN or infinite when its exponent bits are all ones): an OR over integers that compilers vectorize,
// so checking a checkpoint's shards costs a small fraction of reading them. Only a bad block is searched.
inline std::optional<std::size_t> first_non_finite(const float* data, std::size_t count) {
  constexpr std::size_t kBlock = 4096;
  constexpr std::uint32_t kExponent = 0x7f800000u;
  for (std::size_t begin = 0; begin < count; begin += kBlock) {
    const std::size_t end = begin + kBlock < count ? begin + kBlock : count;
    std::uint32_t any = 0;
    for (std::size_t i = begin; i < end; ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, data + i, sizeof bits);
      any |= static_cast<std::uint32_t>((bits & kExponent) == kExponent);
    }
    if (!any) continue;
    for (std::size_t i = begin; i < end; ++i)
      if (!std::isfinite(data[i])) return i;
  }
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
