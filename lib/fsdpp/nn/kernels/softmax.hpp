#pragma once
// The causal softmax of attention (attention.hpp), forward and backward, over rows of the (B,NH,T,T) score
// tensor: row r is query t = r % T and ends at column t. Both work in place.
//
// Document masks (document.hpp): given starts (B*T) and the heads per batch row, row r = (b*heads + h)*T + t also
// begins at column starts[b*T + t]; the columns before it are set to 0 like those above the diagonal. Without
// starts (nullptr) every row begins at column 0: the same loops, the same bits.
//
// Tuned path: one work item per row, exp_fast and the lane helpers so that GCC vectorizes each loop (detail.hpp).
// Portable path (team.hpp): one team per row, threads over the columns, team_max/team_sum reductions: bitwise
// the same on every launch.
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

namespace detail {
// The first visible column of score row r = (b*heads + h)*T + t: its document's start, or 0 without masks.
KOKKOS_INLINE_FUNCTION int row_start(const std::int32_t* starts, std::int64_t r, int T, int heads) {
  return starts ? starts[r / (std::int64_t(heads) * T) * T + r % T] : 0;
}
}  // namespace detail

namespace team {

template <class Real>
void attention_softmax_forward(Real* a, std::int64_t rows, int T, const std::int32_t* starts, int heads) {
  Kokkos::parallel_for(
      "fsdpp::attention_softmax_forward_team", row_policy<Real>(rows), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        const int s0 = detail::row_start(starts, r, T, heads), n = static_cast<int>(r % T) + 1 - s0;
        const Scratch<Real> s(team.team_scratch(0), kSlots);
        Real* row = a + r * T + s0;  // the visible columns [s0, t]
        const Real maxv = team_max<Real>(team, s, n, row);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](const int c) { row[c] = kmath::exp(row[c] - maxv); });
        team.team_barrier();
        const Real inv = Real(1) / team_sum<Real>(team, s, n, [&](int c) { return row[c]; });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, T), [&](const int c) {
          row[c - s0] = c >= s0 && c - s0 < n ? row[c - s0] * inv : Real(0);
        });
      });
}

template <class Real>
void attention_softmax_backward(Real* d, const Real* a, std::int64_t rows, int T, const std::int32_t* starts,
                                int heads) {
  Kokkos::parallel_for(
      "fsdpp::attention_softmax_backward_team", row_policy<Real>(rows), KOKKOS_LAMBDA(const Member& team) {
        const std::int64_t r = team.league_rank();
        const int s0 = detail::row_start(starts, r, T, heads), n = static_cast<int>(r % T) + 1 - s0;
        const Scratch<Real> s(team.team_scratch(0), kSlots);
        const Real* arow = a + r * T + s0;
        Real* drow = d + r * T + s0;
        const Real dot = team_sum<Real>(team, s, n, [&](int c) { return arow[c] * drow[c]; });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, T), [&](const int c) {
          drow[c - s0] = c >= s0 && c - s0 < n ? arow[c - s0] * (drow[c - s0] - dot) : Real(0);
        });
      });
}

}  // namespace team

// att (rows,T) in place: row r <- softmax(row r[s..t]) with t = r % T and s its document start (0 without
// starts), 0 elsewhere. The masked columns may hold garbage on entry (the blocked products leave the upper
// triangle unset); they are never read.
template <class Real>
void attention_softmax_forward(Real* a, std::int64_t rows, int T, const std::int32_t* starts = nullptr,
                               int heads = 1) {
  if (portable()) return team::attention_softmax_forward(a, rows, T, starts, heads);
  // Subtracting the row max keeps exp from overflowing. The exps are the cost here (T^2/2 per head).
  Kokkos::parallel_for(
      "fsdpp::attention_softmax_forward", Kokkos::RangePolicy<ExecSpace>(0, rows),
      KOKKOS_LAMBDA(const std::int64_t r) {
        const int t = static_cast<int>(r % T), s0 = detail::row_start(starts, r, T, heads);
        Real* row = a + r * T;
        for (int t2 = 0; t2 < s0; ++t2) row[t2] = 0;
        row += s0;  // the visible columns [s0, t]
        const int n = t + 1 - s0;
        const Real maxv = detail::lane_max(n, row);
        for (int t2 = 0; t2 < n; ++t2) row[t2] = detail::exp_fast(row[t2] - maxv);
        const Real sum = detail::lane_sum<Real>(n, [=](int t2) { return row[t2]; });
        const Real inv = Real(1) / sum;
        for (int t2 = 0; t2 < n; ++t2) row[t2] *= inv;
        for (int t2 = n; t2 < T - s0; ++t2) row[t2] = 0;
      });
}

// datt (rows,T) in place: drow <- att * (drow - rowsum(att * drow)) over the visible columns [s, t], 0 elsewhere.
// Outside them datt may hold garbage (even NaN) on entry; it is never read.
template <class Real>
void attention_softmax_backward(Real* d, const Real* a, std::int64_t rows, int T, const std::int32_t* starts = nullptr,
                                int heads = 1) {
  if (portable()) return team::attention_softmax_backward(d, a, rows, T, starts, heads);
  Kokkos::parallel_for(
      "fsdpp::attention_softmax_backward", Kokkos::RangePolicy<ExecSpace>(0, rows),
      KOKKOS_LAMBDA(const std::int64_t r) {
        const int t = static_cast<int>(r % T), s0 = detail::row_start(starts, r, T, heads);
        for (int t2 = 0; t2 < s0; ++t2) d[r * T + t2] = 0;
        const Real* arow = a + r * T + s0;
        Real* drow = d + r * T + s0;
        const int n = t + 1 - s0;
        const Real dot = detail::lane_sum<Real>(n, [=](int t2) { return arow[t2] * drow[t2]; });
        for (int t2 = 0; t2 < n; ++t2) drow[t2] = arow[t2] * (drow[t2] - dot);
        for (int t2 = n; t2 < T - s0; ++t2) drow[t2] = 0;
      });
}

}  // namespace fsdpp::kernels
