#pragma once
// Kernels of decoding with a KV cache (nn/kv_cache.hpp). A decode forward runs a ragged batch: N rows, each one
// token of sequence seq[n] at position pos[n] (a prefill has every prompt token of every sequence; a decode
// step one row per sequence), so prompts of different lengths share one batch without padding. The cache holds,
// per sequence, the keys and values of every position so far: k, v (S, capacity, NKV*hs).
//
//   embedding_at       out[n] = wte[tok[n]] (+ wpe[pos[n]]), a token id outside [0, V) giving zeros (tensor
//                      parallelism: another rank's vocabulary row)
//   rope_forward_at    RoPE of q and k heads at each row's own position (kernels/rope.hpp's rotation)
//   kv_cache_append    the rows' k and v into the cache at (seq[n], pos[n])
//   attention_decode   each row's query heads over its sequence's keys 0..pos[n] (causal; GQA)
//   gather_rows        rows[i] of a matrix into row i (the last row of each sequence, for its logits)
//
// GPU-first: one team per (row, head) for the attention (threads over keys, then over channels), team row
// reductions of team.hpp (fixed slots: the same bits on every launch and backend); the rest one work item per
// row. Nothing here allocates: the caller owns every buffer (the scores (N, NH, capacity) included).
#include "fsdpp/nn/kernels/rope.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

// out[n,:] = wte[tokens[n],:] (+ wpe[positions[n],:] when wpe is not empty)
template <class Real>
void embedding_at(const View1<Real>& out,                        // out (N,C)
                  const View1<const std::int32_t>& tokens,       // tokens (N)
                  const View1<const std::int32_t>& positions,    // positions (N)
                  const View1<const Real>& wte,                  // wte (V,C)
                  const View1<const Real>& wpe,                  // wpe (maxT,C) or empty
                  int N, int C) {
  const std::int64_t V = C > 0 ? static_cast<std::int64_t>(wte.extent(0)) / C : 0;
  const bool positions_added = wpe.extent(0) != 0;
  Kokkos::parallel_for(
      "fsdpp::decode_embedding", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const std::int64_t tok = tokens(n);
        const bool valid = tok >= 0 && tok < V;
        Real* o = out.data() + static_cast<std::int64_t>(n) * C;
        const Real* w = wte.data() + (valid ? tok * C : 0);
        const Real* p = positions_added ? wpe.data() + static_cast<std::int64_t>(positions(n)) * C : nullptr;
        for (int c = 0; c < C; ++c) o[c] = (valid ? w[c] : Real(0)) + (p ? p[c] : Real(0));
      });
}

// x <- rope(x) for rows of row_width whose heads [0, heads) sit at positions[n]
template <class T>
void rope_forward_at(const View1<T>& x,                          // x (N,row_width), in place
                     const View1<const T>& cos_t,                // cos (>= max position + 1, hs/2)
                     const View1<const T>& sin_t,                // sin (>= max position + 1, hs/2)
                     const View1<const std::int32_t>& positions, // positions (N)
                     int N, int row_width, int heads, int hs) {
  const int half = hs / 2;
  Kokkos::parallel_for(
      "fsdpp::decode_rope", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const std::int64_t t = positions(n);
        detail::rope_rotate_row(x.data() + static_cast<std::int64_t>(n) * row_width, cos_t.data() + t * half,
                                sin_t.data() + t * half, heads, hs, T(1));
      });
}

// k_cache[seq[n], pos[n], :] = k of row n; v likewise. qkv rows are [q (q_width) | k (kv_width) | v (kv_width)].
template <class T>
void kv_cache_append(const View1<T>& k_cache,                    // (S, capacity, kv_width)
                     const View1<T>& v_cache,                    // (S, capacity, kv_width)
                     const View1<const T>& qkv,                  // (N, q_width + 2 kv_width)
                     const View1<const std::int32_t>& sequence,  // (N)
                     const View1<const std::int32_t>& positions, // (N)
                     int N, int q_width, int kv_width, int capacity) {
  const int W = q_width + 2 * kv_width;
  Kokkos::parallel_for(
      "fsdpp::decode_kv_cache_append", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        const std::int64_t at = (static_cast<std::int64_t>(sequence(n)) * capacity + positions(n)) * kv_width;
        const T* row = qkv.data() + static_cast<std::int64_t>(n) * W + q_width;
        for (int c = 0; c < kv_width; ++c) {
          k_cache(at + c) = row[c];
          v_cache(at + c) = row[kv_width + c];
        }
      });
}

// out[n, h*hs:(h+1)*hs] = softmax_j(q_nh . k_j / sqrt(hs)) v_j over j = 0..pos[n] of row n's sequence, with query
// head h reading key/value head h / (NH/NKV). `scores` (N, NH, capacity) holds the probabilities.
template <class T>
void attention_decode(const View1<T>& out,                       // (N, NH*hs)
                      const View1<T>& scores,                    // (N, NH, capacity), scratch
                      const View1<const T>& qkv,                 // (N, (NH + 2 NKV) hs): q read here
                      const View1<const T>& k_cache,             // (S, capacity, NKV*hs)
                      const View1<const T>& v_cache,             // (S, capacity, NKV*hs)
                      const View1<const std::int32_t>& sequence, // (N)
                      const View1<const std::int32_t>& positions,// (N)
                      int N, int NH, int NKV, int hs, int capacity) {
  using namespace team;
  const int W = (NH + 2 * NKV) * hs, kv_width = NKV * hs, group = NH / NKV;
  const T scale = T(1) / kmath::sqrt(T(hs));
  Kokkos::parallel_for(
      "fsdpp::decode_attention", row_policy<T>(std::int64_t{N} * NH, 2 * kSlots), KOKKOS_LAMBDA(const Member& team) {
        const int n = team.league_rank() / NH, h = team.league_rank() % NH, kv = h / group;
        const int keys = positions(n) + 1;
        const std::int64_t base = static_cast<std::int64_t>(sequence(n)) * capacity * kv_width + kv * hs;
        const T* q = qkv.data() + static_cast<std::int64_t>(n) * W + h * hs;
        T* p = scores.data() + (static_cast<std::int64_t>(n) * NH + h) * capacity;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, keys), [&](const int j) {
          const T* k = k_cache.data() + base + static_cast<std::int64_t>(j) * kv_width;
          T s = T(0);
          for (int d = 0; d < hs; ++d) s += q[d] * k[d];
          p[j] = s * scale;
        });
        team.team_barrier();
        const Scratch<T> slots(team.team_scratch(0), 2 * kSlots);
        T row_max, row_sum;
        team_online_softmax_stats(team, slots, keys, p, row_max, row_sum);
        const T inv = T(1) / row_sum;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, keys), [&](const int j) {
          p[j] = kmath::exp(p[j] - row_max) * inv;
        });
        team.team_barrier();
        T* o = out.data() + static_cast<std::int64_t>(n) * NH * hs + h * hs;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, hs), [&](const int d) {
          const T* v = v_cache.data() + base + d;
          T acc = T(0);
          for (int j = 0; j < keys; ++j) acc += p[j] * v[static_cast<std::int64_t>(j) * kv_width];
          o[d] = acc;
        });
      });
}

// out[i,:] = in[rows[i],:]
template <class T>
void gather_rows(const View1<T>& out,                            // (S, C)
                 const View1<const T>& in,                       // (N, C)
                 const View1<const std::int32_t>& rows,          // (S)
                 int S, int C) {
  Kokkos::parallel_for(
      "fsdpp::decode_gather_rows", Kokkos::RangePolicy<ExecSpace>(0, S), KOKKOS_LAMBDA(const int i) {
        const T* src = in.data() + static_cast<std::int64_t>(rows(i)) * C;
        T* dst = out.data() + static_cast<std::int64_t>(i) * C;
        for (int c = 0; c < C; ++c) dst[c] = src[c];
      });
}

}  // namespace fsdpp::kernels
