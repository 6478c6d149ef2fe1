#pragma once
// Element types that cross the wire and, later, the disk. Kokkos-free (bf16 is only named here; bf16.hpp
// defines it), so that the deck, which stores a DType, does not pull in Kokkos.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fsdpp {

struct bf16;

// i64: the fixed-point words of reproducible mode's exact sums (tensor/fixed_point.hpp); sums are exact.
enum class DType { f32, f64, bf16, i64, bytes };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::bytes: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::bytes: return "bytes";
  }
  return "?";
}

// Raw bytes cannot be summed or compared; every other dtype can.
constexpr bool dtype_is_arithmetic(DType t) { return t != DType::bytes; }

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<unsigned char> { static constexpr DType value = DType::bytes; };
template <> struct dtype_of<std::byte> { static constexpr DType value = DType::bytes; };
template <class T> inline constexpr DType dtype_of_v = dtype_of<T>::value;

}  // namespace fsdpp
