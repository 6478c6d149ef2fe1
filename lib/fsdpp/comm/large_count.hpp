#pragma once
// MPI counts are `int`, so one call moves at most 2^31 - 1 elements. Larger transfers are cut into pieces of
// at most `max_elements`; the cut is computed here, apart from MPI, so tests can check it for counts like
// 5e9 without allocating them, and run the real collectives with a tiny `max_elements` to walk the same code.
#include <algorithm>
#include <climits>
#include <cstddef>

namespace fsdpp {

struct Piece {
  std::size_t offset;  // elements
  int count;           // elements, 1 ≤ count ≤ max_elements
};

class PiecePlan {
 public:
  PiecePlan(std::size_t total, std::size_t max_elements)
      : total_(total), max_(std::max<std::size_t>(1, std::min<std::size_t>(max_elements, INT_MAX))) {}

  std::size_t pieces() const { return (total_ + max_ - 1) / max_; }
  Piece piece(std::size_t i) const {
    const std::size_t offset = i * max_;
    return {offset, static_cast<int>(std::min(max_, total_ - offset))};
  }
  template <class F> void for_each(F&& f) const {
    for (std::size_t i = 0, n = pieces(); i < n; ++i) f(piece(i));
  }

 private:
  std::size_t total_;
  std::size_t max_;
};

}  // namespace fsdpp
