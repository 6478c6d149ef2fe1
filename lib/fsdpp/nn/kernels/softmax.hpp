#pragma once
// The causal softmax of attention (attention.hpp), forward and backward, over rows of the (B,NH,T,T) score
// tensor: row r is query t = r % T and ends at column t. Both work in place.
//
// Tuned path: one work item per row, exp_fast and the lane helpers so that GCC vectorizes each loop (detail.hpp).
// Portable path (team.hpp): one team per row, threads over the columns, team_max/team_sum reductions: bitwise
// the same on every launch.
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

namespace team {

template <class Real> void attention_softmax_forward(Real* a, std::int64_t rows, int T) {
  Kokkos::parallel_for(
      "fsdpp::attention_softmax_forward_team", row_policy<Real>(rows), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        const int n = static_cast<int>(r % T) + 1;
        const Scratch<Real> s(team.team_scratch(0), kSlots);
        Real* row = a + r * T;
        const Real maxv = team_max<Real>(team, s, n, row);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](const int c) { row[c] = kmath::exp(row[c] - maxv); });
        team.team_barrier();
        const Real inv = Real(1) / team_sum<Real>(team, s, n, [&](int c) { return row[c]; });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, T), [&](const int c) { row[c] = c < n ? row[c] * inv : Real(0); });
      });
}

template <class Real> void attention_softmax_backward(Real* d, const Real* a, std::int64_t rows, int T) {
  Kokkos::parallel_for(
      "fsdpp::attention_softmax_backward_team", row_policy<Real>(rows), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        const int n = static_cast<int>(r % T) + 1;
        const Scratch<Real> s(team.team_scratch(0), kSlots);
        const Real* arow = a + r * T;
        Real* drow = d + r * T;
        const Real dot = team_sum<Real>(team, s, n, [&](int c) { return arow[c] * drow[c]; });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, T),
                             [&](const int c) { drow[c] = c < n ? arow[c] * (drow[c] - dot) : Real(0); });
      });
}

}  // namespace team

// att (rows,T) in place: row r <- softmax(row r[0..t]) with t = r % T, 0 above the diagonal. The upper triangle
// may hold garbage on entry (the blocked products leave it unset); it is never read.
template <class Real> void attention_softmax_forward(Real* a, std::int64_t rows, int T) {
  if (portable()) return team::attention_softmax_forward(a, rows, T);
  // Subtracting the row max keeps exp from overflowing. The exps are the cost here (T^2/2 per head).
  Kokkos::parallel_for(
      "fsdpp::attention_softmax_forward", Kokkos::RangePolicy<ExecSpace>(0, rows),
      KOKKOS_LAMBDA(const std::int64_t r) {
        const int t = static_cast<int>(r % T);
        Real* row = a + r * T;
        const Real maxv = detail::lane_max(t + 1, row);
        for (int t2 = 0; t2 <= t; ++t2) row[t2] = detail::exp_fast(row[t2] - maxv);
        const Real sum = detail::lane_sum<Real>(t + 1, [=](int t2) { return row[t2]; });
        const Real inv = Real(1) / sum;
        for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) row[t2] = 0;
      });
}

// datt (rows,T) in place: drow <- att * (drow - rowsum(att * drow)) over t2 <= t, 0 above the diagonal. Above
// the diagonal datt may hold garbage (even NaN) on entry; it is never read.
template <class Real> void attention_softmax_backward(Real* d, const Real* a, std::int64_t rows, int T) {
  if (portable()) return team::attention_softmax_backward(d, a, rows, T);
  Kokkos::parallel_for(
      "fsdpp::attention_softmax_backward", Kokkos::RangePolicy<ExecSpace>(0, rows),
      KOKKOS_LAMBDA(const std::int64_t r) {
        const int t = static_cast<int>(r % T);
        const Real* arow = a + r * T;
        Real* drow = d + r * T;
        const Real dot = detail::lane_sum<Real>(t + 1, [=](int t2) { return arow[t2] * drow[t2]; });
        for (int t2 = 0; t2 <= t; ++t2) drow[t2] = arow[t2] * (drow[t2] - dot);
        for (int t2 = t + 1; t2 < T; ++t2) drow[t2] = 0;
      });
}

}  // namespace fsdpp::kernels
