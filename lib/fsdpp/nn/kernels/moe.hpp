#pragma once
// Mixture-of-experts kernels (nn/moe.hpp): the router's softmax and top-k, the gather of token rows into
// expert order, the weighted combine back, and their backward passes.
//
// Shapes: N token rows, C channels, E experts, k experts per token, R = the rows routed to experts (N*k, fewer
// when a capacity drops some). "Slots" are the R rows of the expert-ordered buffers: slot s holds token
// slot_token[s]'s row for its pair slot_pair[s] = t*k + j (its j-th choice); token_slot[t*k + j] is that slot, or
// -1 when a capacity dropped the pair. The order of the slots (by expert, then by token) is fixed by the host's
// counting sort (MoeFeedForward::route), so every reduction below runs in a fixed order: the kernels are
// deterministic on any launch, which the reproducible mode needs.
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

// Per row t: probs = softmax(logits), lse = logsumexp(logits); the k largest of probs + bias (bias empty: none;
// DeepSeek-V3's balancing bias chooses, it does not weigh), ties to the lower expert index (torch.topk leaves
// the order of ties unspecified: exact ties do not occur with trained routers);
// their probabilities into weights, divided by their sum when `normalize` (norm_topk_prob).
template <class T>
void router_topk(const View1<T>& probs,                // probs (N,E)
                 const View1<T>& lse,                  // lse (N)
                 const View1<std::int32_t>& selected,  // selected (N,k): expert ids, best first
                 const View1<T>& weights,              // weights (N,k): the combine weights
                 const View1<const T>& logits,         // logits (N,E)
                 const View1<const T>& bias,           // bias (E), or empty
                 int N, int E, int k, bool normalize) {
  const bool biased = bias.extent(0) != 0;
  Kokkos::parallel_for(
      "fsdpp::router_topk", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int t) {
        const T* z = logits.data() + std::int64_t{t} * E;
        T* p = probs.data() + std::int64_t{t} * E;
        T m = z[0];
        for (int e = 1; e < E; ++e) m = z[e] > m ? z[e] : m;
        T sum = 0;
        for (int e = 0; e < E; ++e) sum += kmath::exp(z[e] - m);
        for (int e = 0; e < E; ++e) p[e] = kmath::exp(z[e] - m) / sum;
        lse(t) = m + kmath::log(sum);
        T chosen_sum = 0;
        for (int j = 0; j < k; ++j) {
          int best = -1;
          T best_score = 0;
          for (int e = 0; e < E; ++e) {
            bool taken = false;
            for (int i = 0; i < j; ++i) taken = taken || selected(std::int64_t{t} * k + i) == e;
            const T score = p[e] + (biased ? bias(e) : T(0));
            if (!taken && (best < 0 || score > best_score)) best = e, best_score = score;
          }
          selected(std::int64_t{t} * k + j) = best;
          weights(std::int64_t{t} * k + j) = p[best];
          chosen_sum += p[best];
        }
        if (normalize)
          for (int j = 0; j < k; ++j) weights(std::int64_t{t} * k + j) /= chosen_sum;
      });
}

// Per expert e: sums[e] = sum over the N rows of probs[:, e], in row order.
template <class T>
void router_probability_sums(const View1<T>& sums, const View1<const T>& probs, int N, int E) {
  Kokkos::parallel_for(
      "fsdpp::router_probability_sums", Kokkos::RangePolicy<ExecSpace>(0, E), KOKKOS_LAMBDA(const int e) {
        T s = 0;
        for (int t = 0; t < N; ++t) s += probs(std::int64_t{t} * E + e);
        sums(e) = s;
      });
}

// xs[s] = x[slot_token[s]]: the routed rows in expert order.
template <class T>
void gather_routed_rows(const View1<T>& xs,                       // xs (R,C)
                        const View1<const T>& x,                  // x (N,C)
                        const View1<const std::int32_t>& slot_token,  // (R)
                        std::int64_t R, int C) {
  Kokkos::parallel_for(
      "fsdpp::gather_routed_rows", Kokkos::RangePolicy<ExecSpace>(0, R * C), KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t s = i / C, c = i % C;
        xs(i) = x(std::int64_t{slot_token(s)} * C + c);
      });
}

// out[t] (=, or += when `accumulate`) sum_j weights[t,j] * rows[token_slot[t,j]], j in order; a dropped pair adds
// nothing, and empty weights are ones. The combine (weighted, into the block's output) and the gather's backward
// (unweighted, into d(x)) are this one sum.
template <class T>
void sum_routed_rows(const View1<T>& out,                        // out (N,C)
                     const View1<const T>& rows,                 // rows (R,C), expert order
                     const View1<const std::int32_t>& token_slot,  // (N,k)
                     const View1<const T>& weights,              // (N,k), or empty
                     int N, int C, int k, bool accumulate) {
  const bool weighted = weights.extent(0) != 0;
  Kokkos::parallel_for(
      "fsdpp::sum_routed_rows", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t{N} * C), KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t t = i / C, c = i % C;
        T acc = 0;
        for (int j = 0; j < k; ++j) {
          const std::int32_t s = token_slot(t * k + j);
          if (s >= 0) acc += (weighted ? weights(t * k + j) : T(1)) * rows(std::int64_t{s} * C + c);
        }
        out(i) = accumulate ? out(i) + acc : acc;
      });
}

// The combine's backward: dys[s] = weights[pair] * dout[token] for every slot; dweights[t,j] = dout[t] . ys[slot]
// (0 for a dropped pair).
template <class T>
void combine_routed_rows_backward(const View1<T>& dys,                       // dys (R,C), overwritten
                                  const View1<T>& dweights,                  // dweights (N,k), overwritten
                                  const View1<const T>& dout,                // dout (N,C)
                                  const View1<const T>& ys,                  // ys (R,C)
                                  const View1<const std::int32_t>& slot_pair,   // (R)
                                  const View1<const std::int32_t>& token_slot,  // (N,k)
                                  const View1<const T>& weights,             // (N,k)
                                  std::int64_t R, int N, int C, int k) {
  Kokkos::parallel_for(
      "fsdpp::combine_routed_rows_backward_rows", Kokkos::RangePolicy<ExecSpace>(0, R * C),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t s = i / C, c = i % C, pair = slot_pair(s), t = pair / k;
        dys(i) = weights(pair) * dout(t * C + c);
      });
  Kokkos::parallel_for(
      "fsdpp::combine_routed_rows_backward_weights", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t{N} * k),
      KOKKOS_LAMBDA(const std::int64_t pair) {
        const std::int32_t s = token_slot(pair);
        T acc = 0;
        if (s >= 0)
          for (int c = 0; c < C; ++c) acc += dout(pair / k * C + c) * ys(std::int64_t{s} * C + c);
        dweights(pair) = acc;
      });
}

// The router's backward, to d(logits) (N,E), overwritten. From the combine weights' gradient dweights:
// renormalised (w_j = p_j / S, S the chosen probabilities' sum), d p_j = (dw_j - sum_i dw_i w_i) / S; plain, d p_j =
// dw_j. Plus the load-balancing loss's d p_e = aux_grad[e] for every row (empty: none) and the z-loss
// z_scale * lse^2's d(logits) = 2 z_scale lse p. Then through the softmax: dz_e = p_e (dp_e - sum_i p_i dp_i).
template <class T>
void router_backward(const View1<T>& dlogits,                    // dlogits (N,E)
                     const View1<const T>& probs,                 // probs (N,E)
                     const View1<const T>& lse,                   // lse (N)
                     const View1<const std::int32_t>& selected,  // (N,k)
                     const View1<const T>& weights,               // (N,k)
                     const View1<const T>& dweights,              // (N,k)
                     const View1<const T>& aux_grad,              // (E), or empty
                     T z_scale, int N, int E, int k, bool normalize) {
  const bool aux = aux_grad.extent(0) != 0;
  Kokkos::parallel_for(
      "fsdpp::router_backward", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int t) {
        const T* p = probs.data() + std::int64_t{t} * E;
        T* dz = dlogits.data() + std::int64_t{t} * E;
        const std::int64_t row = std::int64_t{t} * k;
        for (int e = 0; e < E; ++e) dz[e] = aux ? aux_grad(e) : T(0);  // dz holds d(probs) first
        T chosen_sum = 0, dot = 0;
        for (int j = 0; j < k; ++j) chosen_sum += p[selected(row + j)], dot += dweights(row + j) * weights(row + j);
        for (int j = 0; j < k; ++j)
          dz[selected(row + j)] += normalize ? (dweights(row + j) - dot) / chosen_sum : dweights(row + j);
        T pdp = 0;
        for (int e = 0; e < E; ++e) pdp += p[e] * dz[e];
        for (int e = 0; e < E; ++e) dz[e] = p[e] * (dz[e] - pdp) + T(2) * z_scale * lse(t) * p[e];
      });
}

}  // namespace fsdpp::kernels
