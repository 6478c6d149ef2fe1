#pragma once
// Softmax + cross-entropy over the vocabulary, fused: loss[n] = logsumexp(logits[n,:]) - logits[n,target[n]],
// computed with the row maximum subtracted so that no exp overflows.
//
// !!! crossentropy_forward_backward OVERWRITES ITS INPUT: on return `logits` holds dlogits, not logits. !!!
// This is the one kernel that does not follow the accumulate (+=) rule of backward kernels: the (N,V) logits
// are the largest activation of the model, and writing the gradient in their place saves a second (N,V)
// buffer. The logits are dead after the loss anyway. Use crossentropy_forward when they must survive
// (validation, sampling).
//
// dloss is d(objective)/d(loss[n]), the same for every row: 1/N for a mean over the rows (times any loss scale).
//
// Targets outside [0, V) mark a row as ignored (PyTorch's ignore_index, e.g. -1): its loss is 0 and, in the
// fused kernel, its dlogits row is 0; no logit is read at the target. The data loader validates tokens, so in
// training this only keeps a bad target from reading out of bounds. dloss = 1/N still counts such rows in N.
//
// Portable path (team.hpp): one team per row; one read pass over V computes the online max and sum of exp
// (team_online_softmax_stats), one more read-write pass writes dlogits. Bitwise the same on every launch.
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

namespace team {

template <class T>
void crossentropy_forward_backward(const View1<T>& logits, const View1<T>& losses,
                                   const View1<const std::int32_t>& targets, int N, int V, T dloss) {
  Kokkos::parallel_for(
      "fsdpp::crossentropy_forward_backward_team", row_policy<T>(N, 2 * kSlots), KOKKOS_LAMBDA(const Member& team) {
        const int n = team.league_rank();
        const Scratch<T> s(team.team_scratch(0), 2 * kSlots);
        T* x = logits.data() + static_cast<std::int64_t>(n) * V;
        const int tgt = targets(n);
        if (tgt < 0 || tgt >= V) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, V), [&](const int v) { x[v] = T(0); });
          Kokkos::single(Kokkos::PerTeam(team), [&]() { losses(n) = T(0); });
          return;
        }
        T mx, sum;
        team_online_softmax_stats<T>(team, s, V, x, mx, sum);
        const T x_tgt = x[tgt];
        team.team_barrier();  // every thread has read x[tgt] before any overwrites it
        const T scale = dloss / sum;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, V),
                             [&](const int v) { x[v] = kmath::exp(x[v] - mx) * scale; });
        team.team_barrier();
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          x[tgt] -= dloss;
          losses(n) = kmath::log(sum) + mx - x_tgt;
        });
      });
}

template <class T>
void crossentropy_forward(const View1<T>& losses, const View1<const T>& logits,
                          const View1<const std::int32_t>& targets, int N, int V) {
  Kokkos::parallel_for(
      "fsdpp::crossentropy_forward_team", row_policy<T>(N, 2 * kSlots), KOKKOS_LAMBDA(const Member& team) {
        const int n = team.league_rank();
        const Scratch<T> s(team.team_scratch(0), 2 * kSlots);
        const T* x = logits.data() + static_cast<std::int64_t>(n) * V;
        const int tgt = targets(n);
        if (tgt < 0 || tgt >= V) {
          Kokkos::single(Kokkos::PerTeam(team), [&]() { losses(n) = T(0); });
          return;
        }
        T mx, sum;
        team_online_softmax_stats<T>(team, s, V, x, mx, sum);
        Kokkos::single(Kokkos::PerTeam(team), [&]() { losses(n) = kmath::log(sum) + mx - x[tgt]; });
      });
}

}  // namespace team

// losses[n] = -log softmax(logits[n,:])[targets[n]];  logits <- dloss * (softmax(logits) - onehot(targets))
template <class T>
void crossentropy_forward_backward(const View1<T>& logits,                    // logits (N,V) in, dlogits (N,V) out
                                   const View1<T>& losses,                    // losses (N)
                                   const View1<const std::int32_t>& targets,  // targets (N)
                                   int N, int V, T dloss) {
  if (portable()) return team::crossentropy_forward_backward<T>(logits, losses, targets, N, V, dloss);
  Kokkos::parallel_for(
      "fsdpp::crossentropy_forward_backward", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        T* x = logits.data() + static_cast<std::int64_t>(n) * V;
        const int tgt = targets(n);
        if (tgt < 0 || tgt >= V) {
          losses(n) = T(0);
          for (int v = 0; v < V; ++v) x[v] = T(0);
          return;
        }
        const T mx = detail::lane_max(V, x);
        const T x_tgt = x[tgt];
        // exp is the costly part, so each one is computed once and kept in place of its logit.
        T part[detail::kLanes];
        for (int l = 0; l < detail::kLanes; ++l) part[l] = T(0);
        int v = 0;
        for (; v + detail::kLanes <= V; v += detail::kLanes)
          for (int l = 0; l < detail::kLanes; ++l) {
            const T e = detail::exp_fast(x[v + l] - mx);
            x[v + l] = e;
            part[l] += e;
          }
        T sum = T(0);
        for (int l = 0; l < detail::kLanes; ++l) sum += part[l];
        for (; v < V; ++v) {
          const T e = detail::exp_fast(x[v] - mx);
          x[v] = e;
          sum += e;
        }
        losses(n) = kmath::log(sum) + mx - x_tgt;
        const T scale = dloss / sum;
        for (v = 0; v < V; ++v) x[v] *= scale;
        x[tgt] -= dloss;
      });
}

// losses[n] = -log softmax(logits[n,:])[targets[n]]; logits are left untouched.
template <class T>
void crossentropy_forward(const View1<T>& losses,                    // losses (N)
                          const View1<const T>& logits,              // logits (N,V)
                          const View1<const std::int32_t>& targets,  // targets (N)
                          int N, int V) {
  if (portable()) return team::crossentropy_forward<T>(losses, logits, targets, N, V);
  Kokkos::parallel_for(
      "fsdpp::crossentropy_forward", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const T* x = logits.data() + static_cast<std::int64_t>(n) * V;
        const int tgt = targets(n);
        if (tgt < 0 || tgt >= V) {
          losses(n) = T(0);
          return;
        }
        const T mx = detail::lane_max(V, x);
        const T sum = detail::lane_sum<T>(V, [=](int v) { return detail::exp_fast(x[v] - mx); });
        losses(n) = kmath::log(sum) + mx - x[tgt];
      });
}

// The mean of the first n per-position losses: the step's loss, one reduction for every model.
inline double mean_loss(const View1<float>& losses, int n) {
  double total = 0.0;
  Kokkos::parallel_reduce(
      "fsdpp::mean_loss", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(const int i, double& sum) { sum += losses(i); }, total);
  return total / n;
}

}  // namespace fsdpp::kernels
