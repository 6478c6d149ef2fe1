#pragma once
// Helpers that several test files need the same way, in one place. FSDPP_UNITY_BUILD compiles the test programs
// in batches of files (tests/CMakeLists.txt), where two files' file-scope helpers of one name collide; a helper
// that more than one file uses lives here, and a file's own helpers keep names no other file of its program uses.
#include "fsdpp/ckpt/safetensors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/types.hpp"

#include <Kokkos_Core.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace fsdpp::test {

// The message of the UsageError `f` throws, or "(no UsageError)" when it throws none.
template <class F> std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

// `n` values uniform in [lo, hi), or in [-range, range), drawn from std::mt19937(seed).
inline std::vector<double> random_vec(std::size_t n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}
inline std::vector<double> random_vector(std::size_t n, unsigned seed, double range = 1.0) {
  return random_vec(n, seed, -range, range);
}

// Device views of host values and back. to_view(h) and to_host(v) copy as they are; to_view<Real>(doubles)
// rounds each value to Real (the more specialized overload, so to_view<double>(doubles) is it too, with the same
// values), and to_vec(v) reads any view back as doubles.
template <class T> View1<T> to_view(const std::vector<T>& h) {
  View1<T> v("test", h.size());
  Kokkos::deep_copy(v, HostView1<T>(const_cast<T*>(h.data()), h.size()));
  return v;
}
template <class T> std::vector<T> to_host(const View1<T>& v) {
  std::vector<T> h(v.extent(0));
  Kokkos::deep_copy(HostView1<T>(h.data(), h.size()), v);
  return h;
}
template <class Real> View1<Real> to_view(const std::vector<double>& h) {
  View1<Real> v("test", h.size());
  auto m = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.size(); ++i) m(i) = static_cast<Real>(h[i]);
  Kokkos::deep_copy(v, m);
  return v;
}
template <class Real> std::vector<double> to_vec(const View1<Real>& v) {
  auto m = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(m, v);
  return std::vector<double>(m.data(), m.data() + m.extent(0));
}

// Whether `part` occurs in `text`.
inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Element-wise a - b, and the dot product of a and b.
inline std::vector<double> minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}
inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// max |a - ref| / max |ref|: a relative error of the tensor, not of each element (some gradients are ~0); the
// sizes must agree, and a zero reference gives the absolute error.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& ref) {
  REQUIRE(a.size() == ref.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  return den > 0 ? num / den : num;
}
// The same ratio with no checks: over a's size, and infinite or NaN against a zero reference.
inline double rel_diff(const std::vector<double>& a, const std::vector<double>& ref) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return diff / scale;
}

// Central differences of loss() with respect to every element of x, step 1e-6 relative.
inline std::vector<double> fd_grad(std::vector<double>& x, const std::function<double()>& loss) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i], h = 1e-6 * std::max(1.0, std::fabs(saved));
    x[i] = saved + h;
    const double lp = loss();
    x[i] = saved - h;
    const double lm = loss();
    x[i] = saved;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

// Writes `bytes` to `path` (binary, truncating).
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Named F32 tensors, each its shape and values, as a Hugging Face checkpoint holds them; written as a safetensors
// file with transformers' {"format": "pt"} metadata.
using NamedTensors = std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<float>>>;
inline void write_safetensors(const std::string& path, const NamedTensors& t) {
  SafetensorsWriter w(path, {{"format", "pt"}});
  for (const auto& [name, st] : t) w.declare(name, st.first, "F32");
  for (const auto& [name, st] : t) w.write(name, st.second.data(), st.second.size());
  w.finish();
}

// <temp>/fsdpp-<name>, removed if it was there (not created): a folder for a test to write into.
inline std::string fresh_temp_dir(const std::string& name) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("fsdpp-" + name)).string();
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace fsdpp::test
