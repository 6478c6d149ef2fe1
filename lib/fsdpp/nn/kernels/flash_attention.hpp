#pragma once
// Fused causal attention, flash-attention-2 style: the same products as attention.hpp (same packed
// [q (NH*hs) | k (NKV*hs) | v (NKV*hs)] rows, grouped-query heads, 1/sqrt(hs) scale), but no T x T matrix is
// ever stored. Memory is O(B*T*C): forward saves only the per-row logsumexp L (B,NH,T).
//
// Forward: one team per (b, query head h, query tile of `tile` rows). The tile's q rows and, in turn, each key
// tile's k and v rows are staged in team scratch (level 0: shared memory on a GPU); each query row keeps a
// running max m and sum l of its exps (online softmax) and rescales its output accumulator when m grows.
// Key tiles wholly above the diagonal are skipped. out = acc / l, L = m + log(l).
//
// Document masks (AttentionShape::starts, document.hpp): query t sees keys [starts[t], t]. starts is
// non-decreasing along a row, so the key tiles wholly before a query tile's first start are skipped (forward and
// dq), and in the dk/dv kernel the query tiles whose first start lies after the key tile's last key end the loop;
// tiles the mask covers in part are masked element-wise. Without starts every loop begins where it did before.
//
// Backward recomputes P = exp(scale q k^T - L) tile by tile, with D = rowsum(dout * out):
//   dv += P^T dout,  dP = dout v^T,  dS = P * (dP - D),  dq += scale dS k,  dk += scale dS^T q.
// Deterministic, no atomics: dk/dv in one kernel with a team per (b, kv head, key tile), each key row owned by
// one thread summing over the G query heads of its group and the query tiles in a fixed order; dq in another
// with a team per (b, h, query tile). P is recomputed in both (FA2 uses atomics for dq instead).
//
// Each team thread owns whole rows (TeamThreadRange over rows), so the per-row loops are plain scalar code:
// this runs on Serial (team size 1) and compiles for CUDA (team size = tile). Free functions only: nvcc
// refuses KOKKOS_LAMBDA in private or protected members.
#include "fsdpp/nn/kernels/attention.hpp"
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace fsdpp::kernels {

namespace flash_detail {

using Policy = Kokkos::TeamPolicy<ExecSpace>;
using Member = Policy::member_type;
template <class Real>
using Scratch = Kokkos::View<Real*, ExecSpace::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// Rows per tile: the largest of 32, 16, 8 whose staged arrays (`arrays` of tile x hs, tile x tile scores when
// `scores`, two of tile) fit the 48 KiB of shared memory a GPU gives a team by default. float at hs 64: 32
// rows in forward, 16 in the backward kernels (six staged arrays). Each kernel picks its own: they share
// nothing tiled, only the per-row L and D.
template <class Real> int tile_rows(int hs, int arrays, bool scores) {
  for (int tile = 32; tile > 8; tile /= 2) {
    const std::size_t floats = std::size_t(arrays) * tile * hs + (scores ? tile * tile : 0) + 2 * tile;
    if (floats * sizeof(Real) <= 47 * 1024) return tile;  // 1 KiB left for the views' alignment padding
  }
  return 8;
}

// One thread per row on a GPU; host backends run a team as one thread.
inline int team_size(int tile) {
  return std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace> ? 1 : tile;
}

template <class Real> std::size_t bytes(int n) { return Scratch<Real>::shmem_size(static_cast<std::size_t>(n)); }

// A team's scratch, carved in order.
template <class Real> KOKKOS_INLINE_FUNCTION Real* carve(const Member& team, int n) {
  return Scratch<Real>(team.team_scratch(0), static_cast<std::size_t>(n)).data();
}

// The scratch of each kind of attention team, flash and ring alike: which tiles it stages, carved in order. Each
// struct's tile(), bytes() and constructor walk the same list, so the tile size, the scratch a team is given
// and the pointers it carves cannot disagree.
// A forward team: its query tile, a key and a value tile, the output accumulator, the tile's scores, each row's
// running max and sum.
template <class Real> struct ForwardScratch {
  Real *q, *k, *v, *o, *scores, *max, *sum;
  static int tile(int hs) { return tile_rows<Real>(hs, 4, true); }
  static std::size_t bytes(int tile, int hs) {
    return 4 * flash_detail::bytes<Real>(tile * hs) + flash_detail::bytes<Real>(tile * tile) +
           2 * flash_detail::bytes<Real>(tile);
  }
  KOKKOS_INLINE_FUNCTION ForwardScratch(const Member& team, int tile, int hs)
      : q(carve<Real>(team, tile * hs)), k(carve<Real>(team, tile * hs)), v(carve<Real>(team, tile * hs)),
        o(carve<Real>(team, tile * hs)), scores(carve<Real>(team, tile * tile)), max(carve<Real>(team, tile)),
        sum(carve<Real>(team, tile)) {}
};

// A query-gradient team: its query tile, their output gradients and dq, a key and a value tile.
template <class Real> struct QueryGradientScratch {
  Real *q, *dout, *dq, *k, *v;
  static int tile(int hs) { return tile_rows<Real>(hs, 5, false); }
  static std::size_t bytes(int tile, int hs) { return 5 * flash_detail::bytes<Real>(tile * hs); }
  KOKKOS_INLINE_FUNCTION QueryGradientScratch(const Member& team, int tile, int hs)
      : q(carve<Real>(team, tile * hs)), dout(carve<Real>(team, tile * hs)), dq(carve<Real>(team, tile * hs)),
        k(carve<Real>(team, tile * hs)), v(carve<Real>(team, tile * hs)) {}
};

// A key-gradient team: its key and value tile and their gradients, a query tile and its output gradients, the
// query rows' logsumexp and D.
template <class Real> struct KeyGradientScratch {
  Real *k, *v, *dk, *dv, *q, *dout, *lse, *delta;
  static int tile(int hs) { return tile_rows<Real>(hs, 6, false); }
  static std::size_t bytes(int tile, int hs) {
    return 6 * flash_detail::bytes<Real>(tile * hs) + 2 * flash_detail::bytes<Real>(tile);
  }
  KOKKOS_INLINE_FUNCTION KeyGradientScratch(const Member& team, int tile, int hs)
      : k(carve<Real>(team, tile * hs)), v(carve<Real>(team, tile * hs)), dk(carve<Real>(team, tile * hs)),
        dv(carve<Real>(team, tile * hs)), q(carve<Real>(team, tile * hs)), dout(carve<Real>(team, tile * hs)),
        lse(carve<Real>(team, tile)), delta(carve<Real>(team, tile)) {}
};

// In lanes (detail.hpp) so that GCC vectorizes it on a CPU; one lane on a GPU.
template <class Real> KOKKOS_INLINE_FUNCTION Real dot(int n, const Real* a, const Real* b) {
  return detail::lane_sum<Real>(n, [=](int i) { return a[i] * b[i]; });
}

// Stages rows [r0, r0+n) of one head's channels (column offset `col` in rows of width W) into dst (n, hs).
template <class Real>
KOKKOS_INLINE_FUNCTION void stage(const Member& team, Real* dst, const Real* src, int r0, int n, int W, int col,
                                  int hs) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n * hs), [&](const int e) {
    dst[e] = src[std::int64_t(r0 + e / hs) * W + col + e % hs];
  });
}

// The first key of a tile starting at k0 that query row t, whose document starts at `start`, sees.
KOKKOS_INLINE_FUNCTION int first_key(int start, int k0) { return start > k0 ? start - k0 : 0; }

// A query tile's first visible key tile: the one holding the tile's first document start (0 without masks).
KOKKOS_INLINE_FUNCTION int first_key_tile(const std::int32_t* starts, std::int64_t row0, int tile) {
  return starts ? starts[row0] / tile * tile : 0;
}

// One query row t (its document from `start`) against key tile [k0, k0+nc): online-softmax update of (m, l, o).
// srow: nc scratch scores.
template <class Real>
KOKKOS_INLINE_FUNCTION void forward_row(int t, int start, int k0, int nc, int hs, Real scale, const Real* q,
                                        const Real* k, const Real* v, Real* srow, Real* o, Real& m, Real& l) {
  const int n = t - k0 + 1 < nc ? t - k0 + 1 : nc;  // causal: keys t2 <= t
  const int j0 = first_key(start, k0);              // document: keys t2 >= start
  if (n <= j0) return;
  Real mx = m;
  for (int j = j0; j < n; ++j) {
    srow[j] = scale * dot(hs, q, k + j * hs);
    mx = (l == Real(0) && j == j0) || srow[j] > mx ? srow[j] : mx;
  }
  const Real correction = l == Real(0) ? Real(0) : detail::exp_fast(m - mx);
  Real sum = 0;
  for (int j = j0; j < n; ++j) {
    srow[j] = detail::exp_fast(srow[j] - mx);
    sum += srow[j];
  }
  l = l * correction + sum;
  m = mx;
  for (int i = 0; i < hs; ++i) o[i] *= correction;
  for (int j = j0; j < n; ++j)  // over keys outside, so the inner loop runs along a contiguous v row
    for (int i = 0; i < hs; ++i) o[i] += srow[j] * v[j * hs + i];
}

}  // namespace flash_detail

// out (B,T,NH*hs) = softmax(causal(q k^T / sqrt(hs))) v; lse (B,NH,T) receives each row's logsumexp for
// flash_attention_backward. Same inputs and result as attention_forward, to rounding.
template <class Real>
void flash_attention_forward(const View1<Real>& out,        // out (B,T,NH*hs)
                             const View1<Real>& lse,        // lse (B,NH,T)
                             const View1<const Real>& inp,  // inp (B,T,(NH+2NKV)*hs)
                             const AttentionShape& s) {
  using namespace flash_detail;
  const int T = s.T, NH = s.NH, NKV = s.NKV, hs = s.hs, G = s.group(), C = s.q_width(), W = s.row_width();
  const int tile = ForwardScratch<Real>::tile(hs), tiles = (T + tile - 1) / tile;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Real* in = inp.data();
  Real* o = out.data();
  Real* L = lse.data();
  const std::int32_t* starts = s.starts;
  Policy policy(s.B * NH * tiles, team_size(tile));
  policy.set_scratch_size(0, Kokkos::PerTeam(ForwardScratch<Real>::bytes(tile, hs)));
  Kokkos::parallel_for(
      "fsdpp::flash_attention_forward", policy, KOKKOS_LAMBDA(const Member& team) {
        const int qt = team.league_rank() % tiles, h = (team.league_rank() / tiles) % NH;
        const int b = team.league_rank() / tiles / NH, kvh = h / G;
        const int r0 = qt * tile, nr = T - r0 < tile ? T - r0 : tile;
        const ForwardScratch<Real> scratch(team, tile, hs);
        Real *sq = scratch.q, *sk = scratch.k, *sv = scratch.v, *so = scratch.o, *ss = scratch.scores;
        Real *sm = scratch.max, *sl = scratch.sum;
        const Real* rows = in + std::int64_t(b) * T * W;
        stage(team, sq, rows, r0, nr, W, h * hs, hs);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](const int e) { so[e] = 0; });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](const int i) { sm[i] = 0, sl[i] = 0; });
        const std::int64_t row0 = std::int64_t(b) * T + r0;
        // key tiles from the query tile's first document start up to the diagonal
        for (int k0 = first_key_tile(starts, row0, tile); k0 < r0 + nr; k0 += tile) {
          const int nc = T - k0 < tile ? T - k0 : tile;
          team.team_barrier();
          stage(team, sk, rows, k0, nc, W, C + kvh * hs, hs);
          stage(team, sv, rows, k0, nc, W, C + NKV * hs + kvh * hs, hs);
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](const int i) {
            const int start = starts ? starts[row0 + i] : 0;
            forward_row(r0 + i, start, k0, nc, hs, scale, sq + i * hs, sk, sv, ss + i * tile, so + i * hs, sm[i],
                        sl[i]);
          });
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](const int i) {
          const int t = r0 + i;
          const Real inv = Real(1) / sl[i];
          Real* orow = o + (std::int64_t(b) * T + t) * C + h * hs;
          for (int e = 0; e < hs; ++e) orow[e] = so[i * hs + e] * inv;
          L[(std::int64_t(b) * NH + h) * T + t] = sm[i] + kmath::log(sl[i]);
        });
      });
}

namespace flash_detail {

// D[b,h,t] = dout[b,t,h] . out[b,t,h]: the softmax backward's row term, once per row instead of per tile.
template <class Real>
void row_delta(const View1<Real>& delta, const View1<const Real>& dout, const View1<const Real>& out,
               const AttentionShape& s) {
  const int T = s.T, NH = s.NH, hs = s.hs, C = s.q_width();
  const Real* dO = dout.data();
  const Real* O = out.data();
  Real* D = delta.data();
  Kokkos::parallel_for(
      "fsdpp::flash_attention_row_delta", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(s.B) * NH * T),
      KOKKOS_LAMBDA(const std::int64_t r) {
        const std::int64_t t = r % T, h = (r / T) % NH, b = r / T / NH;
        const std::int64_t at = (b * T + t) * C + h * hs;
        D[r] = dot(hs, dO + at, O + at);
      });
}

// Key row t2 (k, v staged) against a staged query tile [q0, q0+nq) of one query head: dk, dv accumulate.
// starts: the tile's queries' document starts (nullptr without masks); non-decreasing, so the queries that see
// t2 (start <= t2) come first.
template <class Real>
KOKKOS_INLINE_FUNCTION void backward_key_row(int t2, int q0, int nq, int hs, Real scale, const Real* k,
                                             const Real* v, const Real* q, const Real* dO, const Real* L,
                                             const Real* D, const std::int32_t* starts, Real* dk, Real* dv) {
  for (int i = t2 > q0 ? t2 - q0 : 0; i < nq; ++i) {  // causal: queries t >= t2
    if (starts && starts[i] > t2) break;              // document: queries whose document starts after t2
    const Real p = detail::exp_fast(scale * dot(hs, q + i * hs, k) - L[i]);
    const Real ds = p * (dot(hs, dO + i * hs, v) - D[i]) * scale;
    for (int e = 0; e < hs; ++e) {
      dv[e] += p * dO[i * hs + e];
      dk[e] += ds * q[i * hs + e];
    }
  }
}

// Query row t (q, dout, L, D given; its document from `start`) against a staged key tile [k0, k0+nc): dq
// accumulates.
template <class Real>
KOKKOS_INLINE_FUNCTION void backward_query_row(int t, int start, int k0, int nc, int hs, Real scale, const Real* q,
                                               const Real* dO, Real L, Real D, const Real* k, const Real* v,
                                               Real* dq) {
  const int n = t - k0 + 1 < nc ? t - k0 + 1 : nc;
  for (int j = first_key(start, k0); j < n; ++j) {
    const Real p = detail::exp_fast(scale * dot(hs, q, k + j * hs) - L);
    const Real ds = p * (dot(hs, dO, v + j * hs) - D) * scale;
    for (int e = 0; e < hs; ++e) dq[e] += ds * k[j * hs + e];
  }
}

template <class Real>
void backward_keys(const View1<Real>& dinp, const View1<const Real>& delta, const View1<const Real>& dout,
                   const View1<const Real>& inp, const View1<const Real>& lse, const AttentionShape& s) {
  const int T = s.T, NH = s.NH, NKV = s.NKV, hs = s.hs, G = s.group(), C = s.q_width(), W = s.row_width();
  const int tile = KeyGradientScratch<Real>::tile(hs), tiles = (T + tile - 1) / tile;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Real *in = inp.data(), *dO = dout.data(), *Lg = lse.data(), *Dg = delta.data();
  Real* din = dinp.data();
  const std::int32_t* starts = s.starts;
  Policy policy(s.B * NKV * tiles, team_size(tile));
  policy.set_scratch_size(0, Kokkos::PerTeam(KeyGradientScratch<Real>::bytes(tile, hs)));
  Kokkos::parallel_for(
      "fsdpp::flash_attention_backward_keys", policy, KOKKOS_LAMBDA(const Member& team) {
        const int kt = team.league_rank() % tiles, kvh = (team.league_rank() / tiles) % NKV;
        const int b = team.league_rank() / tiles / NKV;
        const int k0 = kt * tile, nc = T - k0 < tile ? T - k0 : tile;
        const KeyGradientScratch<Real> scratch(team, tile, hs);
        Real *sk = scratch.k, *sv = scratch.v, *sdk = scratch.dk, *sdv = scratch.dv, *sq = scratch.q;
        Real *sdo = scratch.dout, *sL = scratch.lse, *sD = scratch.delta;
        const Real* rows = in + std::int64_t(b) * T * W;
        const Real* drows = dO + std::int64_t(b) * T * C;
        stage(team, sk, rows, k0, nc, W, C + kvh * hs, hs);
        stage(team, sv, rows, k0, nc, W, C + NKV * hs + kvh * hs, hs);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc * hs), [&](const int e) { sdk[e] = 0, sdv[e] = 0; });
        for (int h = kvh * G; h < (kvh + 1) * G; ++h) {
          const std::int64_t lrow = (std::int64_t(b) * NH + h) * T;
          for (int q0 = k0; q0 < T; q0 += tile) {  // query tiles at or below the diagonal
            const int nq = T - q0 < tile ? T - q0 : tile;
            const std::int32_t* qstarts = starts ? starts + std::int64_t(b) * T + q0 : nullptr;
            if (qstarts && qstarts[0] >= k0 + nc) break;  // this tile's documents, and all later ones, start after it
            team.team_barrier();
            stage(team, sq, rows, q0, nq, W, h * hs, hs);
            stage(team, sdo, drows, q0, nq, C, h * hs, hs);
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nq), [&](const int i) {
              sL[i] = Lg[lrow + q0 + i], sD[i] = Dg[lrow + q0 + i];
            });
            team.team_barrier();
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc), [&](const int j) {
              backward_key_row(k0 + j, q0, nq, hs, scale, sk + j * hs, sv + j * hs, sq, sdo, sL, sD, qstarts,
                               sdk + j * hs, sdv + j * hs);
            });
          }
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc * hs), [&](const int e) {
          Real* row = din + (std::int64_t(b) * T + k0 + e / hs) * W + C + kvh * hs + e % hs;
          row[0] += sdk[e];
          row[NKV * hs] += sdv[e];
        });
      });
}

template <class Real>
void backward_queries(const View1<Real>& dinp, const View1<const Real>& delta, const View1<const Real>& dout,
                      const View1<const Real>& inp, const View1<const Real>& lse, const AttentionShape& s) {
  const int T = s.T, NH = s.NH, NKV = s.NKV, hs = s.hs, G = s.group(), C = s.q_width(), W = s.row_width();
  const int tile = QueryGradientScratch<Real>::tile(hs), tiles = (T + tile - 1) / tile;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Real *in = inp.data(), *dO = dout.data(), *Lg = lse.data(), *Dg = delta.data();
  Real* din = dinp.data();
  const std::int32_t* starts = s.starts;
  Policy policy(s.B * NH * tiles, team_size(tile));
  policy.set_scratch_size(0, Kokkos::PerTeam(QueryGradientScratch<Real>::bytes(tile, hs)));
  Kokkos::parallel_for(
      "fsdpp::flash_attention_backward_queries", policy, KOKKOS_LAMBDA(const Member& team) {
        const int qt = team.league_rank() % tiles, h = (team.league_rank() / tiles) % NH;
        const int b = team.league_rank() / tiles / NH, kvh = h / G;
        const int r0 = qt * tile, nr = T - r0 < tile ? T - r0 : tile;
        const QueryGradientScratch<Real> scratch(team, tile, hs);
        Real *sq = scratch.q, *sdo = scratch.dout, *sdq = scratch.dq, *sk = scratch.k, *sv = scratch.v;
        const Real* rows = in + std::int64_t(b) * T * W;
        const std::int64_t lrow = (std::int64_t(b) * NH + h) * T;
        stage(team, sq, rows, r0, nr, W, h * hs, hs);
        stage(team, sdo, dO + std::int64_t(b) * T * C, r0, nr, C, h * hs, hs);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](const int e) { sdq[e] = 0; });
        const std::int64_t row0 = std::int64_t(b) * T + r0;
        for (int k0 = first_key_tile(starts, row0, tile); k0 < r0 + nr; k0 += tile) {
          const int nc = T - k0 < tile ? T - k0 : tile;
          team.team_barrier();
          stage(team, sk, rows, k0, nc, W, C + kvh * hs, hs);
          stage(team, sv, rows, k0, nc, W, C + NKV * hs + kvh * hs, hs);
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](const int i) {
            const int start = starts ? starts[row0 + i] : 0;
            backward_query_row(r0 + i, start, k0, nc, hs, scale, sq + i * hs, sdo + i * hs, Lg[lrow + r0 + i],
                               Dg[lrow + r0 + i], sk, sv, sdq + i * hs);
          });
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](const int e) {
          din[(std::int64_t(b) * T + r0 + e / hs) * W + h * hs + e % hs] += sdq[e];
        });
      });
}

}  // namespace flash_detail

// Backward of flash_attention_forward. ACCUMULATES (+=) into dinp like attention_backward; delta (B,NH,T) is
// scratch. out and lse are what flash_attention_forward produced.
template <class Real>
void flash_attention_backward(const View1<Real>& dinp,        // dinp (B,T,(NH+2NKV)*hs), +=
                              const View1<Real>& delta,       // delta (B,NH,T), scratch
                              const View1<const Real>& dout,  // dout (B,T,NH*hs)
                              const View1<const Real>& inp,   // inp (B,T,(NH+2NKV)*hs)
                              const View1<const Real>& out,   // out (B,T,NH*hs), from the forward
                              const View1<const Real>& lse,   // lse (B,NH,T), from the forward
                              const AttentionShape& s) {
  flash_detail::row_delta<Real>(delta, dout, out, s);
  const View1<const Real> D = delta;
  flash_detail::backward_keys<Real>(dinp, D, dout, inp, lse, s);
  flash_detail::backward_queries<Real>(dinp, D, dout, inp, lse, s);
}

}  // namespace fsdpp::kernels
