#pragma once
// The median of timings, as every benchmark and calibration of fsdpp takes it: the middle value, the two middle
// ones averaged when the count is even (the upper one alone would be, for two ranks or two repeats, the slower
// of two noisy samples). 0 for none.
#include <algorithm>
#include <vector>

namespace fsdpp {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace fsdpp
