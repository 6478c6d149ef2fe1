// fit_line_relative (plan/line_fit.hpp), the fit fsdpp bench calibrate turns its sweeps into machine figures
// with: an exact line comes back exactly; relative residuals weigh small sizes as much as large ones; noise that
// would give a negative latency or a non-positive bandwidth gives the line through the origin instead.
#include "fsdpp/plan/line_fit.hpp"
#include "fsdpp/runtime/median.hpp"

#include <doctest/doctest.h>

#include <vector>

using fsdpp::fit_line_relative;

TEST_CASE("line fit: an exact latency + bytes / bandwidth line is recovered") {
  const double latency = 20e-6, per_byte = 1.0 / 2e9;  // 20 us, 2 GB/s
  std::vector<double> x, y;
  for (double bytes = 16384; bytes <= 16777216; bytes *= 4) x.push_back(bytes), y.push_back(latency + bytes * per_byte);
  const auto f = fit_line_relative(x, y);
  CHECK(f.intercept == doctest::Approx(latency).epsilon(1e-9));
  CHECK(f.slope == doctest::Approx(per_byte).epsilon(1e-9));
}

TEST_CASE("line fit: relative residuals, so a large size's error does not swamp the small sizes' latency") {
  // 10 us + 1 ns/byte at four sizes, the largest measured 5% slow: the relative fit keeps the latency within 1%
  // (9.91 us); an unweighted fit would put it at 8.18 us, 18% low, from an error at a size where latency is 1%.
  const std::vector<double> x = {1e3, 1e4, 1e5, 1e6};
  std::vector<double> y;
  for (double b : x) y.push_back(1e-5 + 1e-9 * b);
  y.back() *= 1.05;
  const auto f = fit_line_relative(x, y);
  CHECK(f.intercept == doctest::Approx(1e-5).epsilon(0.01));
  CHECK(f.slope == doctest::Approx(1e-9).epsilon(0.03));
}

TEST_CASE("line fit: noise that says a negative intercept or no growth gives the line through the origin") {
  SUBCASE("negative intercept") {
    const auto f = fit_line_relative({1, 2, 3}, {0.5, 2.0, 3.5});  // the unconstrained line: -1 + 1.5 x
    CHECK(f.intercept == 0);
    CHECK(f.slope > 0);
  }
  SUBCASE("falling with size (noisy small sizes)") {
    const auto f = fit_line_relative({1e4, 1e5, 1e6}, {1e-3, 5e-4, 1e-4});
    CHECK(f.intercept == 0);
    CHECK(f.slope > 0);
  }
  SUBCASE("one point") {
    const auto f = fit_line_relative({4}, {2});
    CHECK(f.intercept == 0);
    CHECK(f.slope == doctest::Approx(0.5));
  }
}

TEST_CASE("median: the middle value; the two middle ones averaged for an even count; 0 for none") {
  CHECK(fsdpp::median({3.0, 1.0, 2.0}) == 2.0);
  CHECK(fsdpp::median({4.0, 1.0}) == 2.5);  // not the slower of two
  CHECK(fsdpp::median({5.0, 1.0, 2.0, 4.0}) == 3.0);
  CHECK(fsdpp::median({7.0}) == 7.0);
  CHECK(fsdpp::median({}) == 0.0);
}
