#pragma once
// Vocabulary-parallel embedding and cross-entropy (Megatron-LM's VocabParallelEmbedding and
// vocab_parallel_cross_entropy): each tensor-parallel rank holds rows [v0, v0 + Vl) of wte (and of lm_head),
// looks up only its tokens and computes logits only for its columns. The model all-reduces between the kernels:
//
//   embedding:      x = sum over tp of vocab_parallel_embedding_forward          (1 all-reduce of N*C)
//   cross-entropy:  vocab_parallel_row_max -> all-reduce max (N)
//                   vocab_parallel_sum_exp -> all-reduce sum (2N: sum of exp, target logit)
//                   vocab_parallel_crossentropy_finish: losses, and dlogits in place of the logits
//
// Local token ids: localize_tokens writes tokens - v0, which lies outside [0, Vl) for a token another rank
// holds; the embedding kernels (here and encoder.hpp's backward) skip such rows, so backward reuses
// encoder_backward unchanged.
//
// GPU-first shapes: one team per row (team.hpp), lanes over the columns, fixed-slot reductions.
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

// out[n] = tokens[n] - v0
inline void localize_tokens(const View1<std::int32_t>& out, const View1<const std::int32_t>& tokens, int v0, int N) {
  Kokkos::parallel_for(
      "fsdpp::vocab_parallel_localize_tokens", Kokkos::RangePolicy<ExecSpace>(0, N),
      KOKKOS_LAMBDA(const int n) { out(n) = tokens(n) - v0; });
}

// out[b,t,:] = (local token in [0,Vl) ? wte[tok,:] : 0) + (add_positions ? wpe[t,:] : 0). One tp rank adds
// the positions, so that the all-reduce sum is wte[token] + wpe[t] exactly (the other terms are zeros); a model
// without a position table (Llama) passes add_positions false and an empty wpe.
template <class Real>
void vocab_parallel_embedding_forward(const View1<Real>& out,                       // out (B,T,C)
                                      const View1<const std::int32_t>& local_tokens,// (B,T), tokens - v0
                                      const View1<const Real>& wte,                 // wte rows of this rank (Vl,C)
                                      const View1<const Real>& wpe,                 // wpe (maxT,C)
                                      bool add_positions, int B, int T, int C,
                                      const std::int32_t* positions = nullptr) {  // (B*T): encoder.hpp's
  const std::int64_t Vl = C > 0 ? static_cast<std::int64_t>(wte.extent(0)) / C : 0;
  Kokkos::parallel_for(
      "fsdpp::vocab_parallel_embedding_forward", team::row_policy<Real>(std::int64_t(B) * T, 0),
      KOKKOS_LAMBDA(const team::Member& member) {
        const std::int64_t n = member.league_rank();
        const std::int64_t tok = local_tokens(n);
        const bool owned = tok >= 0 && tok < Vl;
        Real* o = out.data() + n * C;
        const Real* w = wte.data() + (owned ? tok : 0) * C;
        const Real* p = add_positions ? wpe.data() + (positions ? positions[n] : n % T) * C : nullptr;  // Llama: none
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, C), [&](const int c) {
          o[c] = (owned ? w[c] : Real(0)) + (add_positions ? p[c] : Real(0));
        });
      });
}

// stats[n] = max over this rank's logits of row n (stats holds 3N: max, sum of exp, target logit).
template <class Real>
void vocab_parallel_row_max(const View1<Real>& stats, const View1<const Real>& logits, int N, int Vl) {
  Kokkos::parallel_for(
      "fsdpp::vocab_parallel_row_max", team::row_policy<Real>(N), KOKKOS_LAMBDA(const team::Member& member) {
        const int n = member.league_rank();
        const team::Scratch<Real> s(member.team_scratch(0), team::kSlots);
        const Real m = team::team_max<Real>(member, s, Vl, logits.data() + static_cast<std::int64_t>(n) * Vl);
        Kokkos::single(Kokkos::PerTeam(member), [&]() { stats(n) = m; });
      });
}

// With stats[n] the global row max M: stats[N+n] = sum_v exp(x[n,v] - M) over this rank's columns, and
// stats[2N+n] = the target's logit if this rank holds the target's column, else 0.
template <class Real>
void vocab_parallel_sum_exp(const View1<Real>& stats, const View1<const Real>& logits,
                            const View1<const std::int32_t>& targets, int v0, int N, int Vl) {
  Kokkos::parallel_for(
      "fsdpp::vocab_parallel_sum_exp", team::row_policy<Real>(N), KOKKOS_LAMBDA(const team::Member& member) {
        const int n = member.league_rank();
        const team::Scratch<Real> s(member.team_scratch(0), team::kSlots);
        const Real* x = logits.data() + static_cast<std::int64_t>(n) * Vl;
        const Real mx = stats(n);
        const Real sum = team::team_sum<Real>(member, s, Vl, [&](int v) { return kmath::exp(x[v] - mx); });
        const int local = targets(n) - v0;
        Kokkos::single(Kokkos::PerTeam(member), [&]() {
          stats(N + n) = sum;
          stats(2 * N + n) = local >= 0 && local < Vl ? x[local] : Real(0);
        });
      });
}

// With stats all-reduced: losses[n] = log(S) + M - x_target (0 for a target outside [0, V): ignored), and,
// when `gradient`, logits <- dloss * (softmax - onehot(target)) over this rank's columns (0 for ignored rows).
// Every tp rank computes the same losses.
template <class Real>
void vocab_parallel_crossentropy_finish(const View1<Real>& logits, const View1<Real>& losses,
                                        const View1<const Real>& stats, const View1<const std::int32_t>& targets,
                                        int v0, int N, int Vl, int V, Real dloss, bool gradient) {
  Kokkos::parallel_for(
      "fsdpp::vocab_parallel_crossentropy_finish", team::row_policy<Real>(N, 0),
      KOKKOS_LAMBDA(const team::Member& member) {
        const int n = member.league_rank();
        Real* x = logits.data() + static_cast<std::int64_t>(n) * Vl;
        const int tgt = targets(n);
        const bool ignored = tgt < 0 || tgt >= V;
        const Real mx = stats(n), sum = stats(N + n);
        if (gradient) {
          const Real scale = dloss / sum;
          const int local = tgt - v0;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(member, Vl), [&](const int v) {
            x[v] = ignored ? Real(0) : kmath::exp(x[v] - mx) * scale - (v == local ? dloss : Real(0));
          });
        }
        Kokkos::single(Kokkos::PerTeam(member), [&]() {
          losses(n) = ignored ? Real(0) : kmath::log(sum) + mx - stats(2 * N + n);
        });
      });
}

}  // namespace fsdpp::kernels
