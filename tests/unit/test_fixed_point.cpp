// The fixed-point words of reproducible mode (tensor/fixed_point.hpp): a sum of words does not depend on the
// order or the grouping of its terms, converts back close to the exact sum, and carries non-finite elements
// through as NaN.
#include "fsdpp/tensor/fixed_point.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

using namespace fsdpp;

namespace {

using Words = std::array<std::int64_t, GradientWords::words>;

Words cut(float g) {
  Words w{};
  GradientWords::cut(g, w.data());
  return w;
}

Words sum(const std::vector<float>& xs) {
  Words total{};
  for (float x : xs) {
    const Words w = cut(x);
    for (int j = 0; j < GradientWords::words; ++j) total[j] += w[j];
  }
  return total;
}

}  // namespace

TEST_CASE("fixed point: the sum of gradient words is the same for every order and grouping of the terms") {
  std::mt19937 rng(7);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> xs(1000);
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = gauss(rng) * std::ldexp(1.0f, static_cast<int>(i % 40) - 30);
  const Words once = sum(xs);
  std::vector<float> shuffled = xs;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  CHECK(sum(shuffled) == once);
  // Grouped as ranks would: partial sums of 3 unequal parts, then the parts added.
  Words parts{};
  for (const auto& [begin, end] : {std::pair<int, int>{0, 137}, {137, 600}, {600, 1000}}) {
    const Words part = sum(std::vector<float>(xs.begin() + begin, xs.begin() + end));
    for (int j = 0; j < GradientWords::words; ++j) parts[j] += part[j];
  }
  CHECK(parts == once);
  // Float sums in those orders differ: what the words remove.
  float forward = 0, backward = 0;
  for (float x : xs) forward += x;
  for (auto it = xs.rbegin(); it != xs.rend(); ++it) backward += *it;
  CHECK(forward != backward);
  // Close to the exact sum (long double), and the mean over units divides once.
  long double exact = 0;
  for (float x : xs) exact += x;
  CHECK(GradientWords::mean(once.data(), 1.0) == doctest::Approx(static_cast<double>(exact)).epsilon(1e-7));
  CHECK(GradientWords::mean(once.data(), 4.0) == static_cast<float>(GradientWords::Format::value(once.data()) / 4.0));
}

TEST_CASE("fixed point: a float above 2^-30 is cut exactly; smaller ones keep their bits down to 2^-54") {
  for (float g : {1.0f, -3.5f, 0.1f, -1.2345e-3f, 7.0e5f, std::ldexp(1.0f, -30), -std::ldexp(1.7f, -20)}) {
    CAPTURE(g);
    CHECK(GradientWords::mean(cut(g).data(), 1.0) == g);
  }
  const float tiny = std::ldexp(1.2345f, -40);  // 24 bits from 2^-40 down to 2^-63: those below 2^-54 dropped
  const float back = GradientWords::mean(cut(tiny).data(), 1.0);
  CHECK(back != tiny);
  CHECK(std::fabs(back - tiny) < std::ldexp(1.0f, -54));
}

TEST_CASE("fixed point: NaN, Inf and elements beyond 2^24 convert back to NaN, even summed with finite ones") {
  for (float bad : {std::nanf(""), INFINITY, -INFINITY, 3.0e7f}) {
    CAPTURE(bad);
    Words w = sum({0.5f, bad, -2.0f});
    CHECK(std::isnan(GradientWords::mean(w.data(), 3.0)));
    // The marker survives as many units as a step may hold.
    for (std::int64_t u = 1; u < GradientWords::kMaxUnits; ++u) w[1] += cut(bad)[1];
    CHECK(std::isnan(GradientWords::mean(w.data(), 3.0)));
  }
  // The largest finite sum of low words a step can hold stays apart from one marker.
  Words most{};
  most[1] = (std::int64_t{1} << 30) * GradientWords::kMaxUnits;
  CHECK_FALSE(std::isnan(GradientWords::mean(most.data(), 1.0)));
}

TEST_CASE("fixed point: loss and square words sum exactly in any order") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.0, 12.0);
  std::vector<double> xs(300);
  for (double& x : xs) x = u(rng);
  auto total = [](const std::vector<double>& v) {
    std::array<std::int64_t, SquareWords::words> t{};
    for (double x : v) {
      std::int64_t w[SquareWords::words];
      SquareWords::cut(x * x, w);
      for (int j = 0; j < SquareWords::words; ++j) t[j] += w[j];
    }
    return t;
  };
  const auto a = total(xs);
  std::reverse(xs.begin(), xs.end());
  CHECK(total(xs) == a);
  long double exact = 0;
  for (double x : xs) exact += static_cast<long double>(x) * x;
  CHECK(SquareWords::value(a.data()) == doctest::Approx(static_cast<double>(exact)).epsilon(1e-15));
}
