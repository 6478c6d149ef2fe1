#pragma once
// Ring attention's block kernels (context parallelism, nn/context_parallel.hpp): the fused kernels of
// flash_attention.hpp with queries and keys at global positions, one key/value block of the ring at a time.
//
// Under mesh.cp = n a sequence of T positions is cut into 2n chunks of c = T / 2n rows, and rank r holds chunks r
// and 2n-1-r (the load-balanced causal layout): its Tl = 2c local rows are [chunk r | chunk 2n-1-r]. A ring step
// brings the packed [k | v] rows (B, Tl, 2 NKV hs) of another rank, whose two chunks lie elsewhere in the sequence.
// Each kernel takes both sides' chunk indices (RingBlock) and works out every row's global position, so:
//   - key j is visible to query t iff pos(j) <= pos(t) and pos(j) >= starts[t] (the causal and document masks of
//     the whole sequence, with starts its document starts at global positions);
//   - a (query tile, key chunk) pair whose keys all lie after the tile's last query, or before its first query's
//     document, is skipped whole (the chunks above the causal diagonal cost nothing), and the per-row loops of
//     flash_attention.hpp mask only the tiles a boundary crosses.
//
// Forward keeps FA2's online softmax across the ring: the running max m and sum l of each row's exps live in
// (B,NH,Tl) buffers and the unnormalized output in `out` between steps, each step's kernel loading and storing
// them; ring_finish divides out by l and leaves lse = m + log l. That is the log-sum-exp merge of the blocks'
// partial results, done as the blocks arrive. Backward uses the final lse and D = rowsum(dout * out), which are
// the whole row's, so every block's dq, dk and dv contributions are exact pieces of the sums (FA2's backward):
// dq accumulates into dqkv at each step, and dk, dv of the visiting block are added to the partial sums the ring
// brought and written to the buffer it carries on.
//
// Tiles never cross a chunk: a team takes a (query chunk, tile of it), or a (key chunk, tile of it). Same
// thread layout as flash_attention.hpp: one thread per row on a GPU, a team of one on the host.
#include "fsdpp/nn/kernels/flash_attention.hpp"

namespace fsdpp::kernels {

struct RingBlock {
  int B = 0;
  int Tl = 0;  // local rows per sequence: 2 c
  int c = 0;   // rows per chunk
  int NH = 0, NKV = 0, hs = 0;
  int q_chunks[2] = {0, 0};  // this rank's chunks (global indices): rows [0, c) and [c, 2c)
  int k_chunks[2] = {0, 0};  // the visiting block's
  // (B*Tl) each local query's document start, a global position; nullptr: causal only
  const std::int32_t* starts = nullptr;

  KOKKOS_INLINE_FUNCTION int q_pos(int part) const { return q_chunks[part] * c; }
  KOKKOS_INLINE_FUNCTION int k_pos(int part) const { return k_chunks[part] * c; }
  int kv_width() const { return 2 * NKV * hs; }
  AttentionShape local_shape() const { return AttentionShape{B, Tl, NH, NKV, hs, starts}; }
};

namespace ring_detail {

using flash_detail::Member;
using flash_detail::Policy;

// The key rows [k_begin, k_end) (offsets in a key chunk at global position K0) that a query tile at global
// positions [P, P + nr), whose first row's document starts at `start0`, can see: keys up to its last query, from
// its first query's document start (tile-aligned, like flash_attention's first_key_tile). Empty when none.
KOKKOS_INLINE_FUNCTION void visible_keys(int P, int nr, int start0, int K0, int c, int tile, int& k_begin,
                                         int& k_end) {
  k_end = P + nr - K0;  // keys at positions <= P + nr - 1
  if (k_end > c) k_end = c;
  const int first = start0 > K0 ? start0 - K0 : 0;
  k_begin = first / tile * tile;
  if (k_end < 0) k_end = 0;
}

}  // namespace ring_detail

// One ring step's forward: every local query row against the visiting block's keys, the online-softmax state
// (out unnormalized, m, l) carried in from the previous step and out to the next. Zero out, m and l before the
// first step (l = 0 marks a row with nothing seen yet).
template <class Real>
void ring_forward_step(const View1<Real>& out,           // out (B,Tl,NH*hs), running unnormalized sums
                       const View1<Real>& m,             // m (B,NH,Tl), running max
                       const View1<Real>& l,             // l (B,NH,Tl), running sum of exps
                       const View1<const Real>& inp,     // inp (B,Tl,(NH+2NKV)*hs): the local queries
                       const View1<const Real>& kv,      // kv (B,Tl,2*NKV*hs): the visiting [k | v] rows
                       const RingBlock& r) {
  using namespace flash_detail;
  const int Tl = r.Tl, c = r.c, NH = r.NH, NKV = r.NKV, hs = r.hs, G = NH / NKV, C = NH * hs;
  const int W = (NH + 2 * NKV) * hs, KW = r.kv_width();
  const int tile = ForwardScratch<Real>::tile(hs), tiles = (c + tile - 1) / tile;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Real *in = inp.data(), *kvp = kv.data();
  Real *o = out.data(), *M = m.data(), *L = l.data();
  const RingBlock rb = r;
  Policy policy(r.B * NH * 2 * tiles, team_size(tile));
  policy.set_scratch_size(0, Kokkos::PerTeam(ForwardScratch<Real>::bytes(tile, hs)));
  Kokkos::parallel_for(
      "fsdpp::ring_attention_forward", policy, KOKKOS_LAMBDA(const Member& team) {
        const int qt = team.league_rank() % (2 * tiles), h = (team.league_rank() / (2 * tiles)) % NH;
        const int b = team.league_rank() / (2 * tiles) / NH, kvh = h / G;
        const int qpart = qt / tiles, q_off = (qt % tiles) * tile;
        const int r0 = qpart * c + q_off, nr = c - q_off < tile ? c - q_off : tile;  // local rows
        const int P = rb.q_pos(qpart) + q_off;                                       // their first position
        const ForwardScratch<Real> scratch(team, tile, hs);
        Real *sq = scratch.q, *sk = scratch.k, *sv = scratch.v, *so = scratch.o, *ss = scratch.scores;
        Real *sm = scratch.max, *sl = scratch.sum;
        const std::int64_t row0 = std::int64_t(b) * Tl + r0, lrow = (std::int64_t(b) * NH + h) * Tl + r0;
        const Real* rows = in + std::int64_t(b) * Tl * W;
        const Real* krows = kvp + std::int64_t(b) * Tl * KW;
        const std::int32_t* starts = rb.starts;
        stage(team, sq, rows, r0, nr, W, h * hs, hs);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](const int i) {
          const Real* orow = o + (row0 + i) * C + h * hs;
          for (int e = 0; e < hs; ++e) so[i * hs + e] = orow[e];
          sm[i] = M[lrow + i], sl[i] = L[lrow + i];
        });
        for (int kpart = 0; kpart < 2; ++kpart) {
          const int K0 = rb.k_pos(kpart);
          int k_begin = 0, k_end = 0;
          ring_detail::visible_keys(P, nr, starts ? starts[row0] : 0, K0, c, tile, k_begin, k_end);
          for (int j0 = k_begin; j0 < k_end; j0 += tile) {
            const int nc = c - j0 < tile ? c - j0 : tile;
            team.team_barrier();
            stage(team, sk, krows, kpart * c + j0, nc, KW, kvh * hs, hs);
            stage(team, sv, krows, kpart * c + j0, nc, KW, NKV * hs + kvh * hs, hs);
            team.team_barrier();
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](const int i) {
              const int start = starts ? starts[row0 + i] : 0;
              forward_row(P + i, start, K0 + j0, nc, hs, scale, sq + i * hs, sk, sv, ss + i * tile, so + i * hs,
                          sm[i], sl[i]);
            });
          }
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](const int i) {
          Real* orow = o + (row0 + i) * C + h * hs;
          for (int e = 0; e < hs; ++e) orow[e] = so[i * hs + e];
          M[lrow + i] = sm[i], L[lrow + i] = sl[i];
        });
      });
}

// After the last step: out /= l, lse = m + log l (into m's buffer, which is what backward reads).
template <class Real>
void ring_finish(const View1<Real>& out, const View1<Real>& m_to_lse, const View1<const Real>& l, const RingBlock& r) {
  const int Tl = r.Tl, NH = r.NH, hs = r.hs, C = NH * hs;
  Real *o = out.data(), *M = m_to_lse.data();
  const Real* L = l.data();
  Kokkos::parallel_for(
      "fsdpp::ring_attention_finish", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(r.B) * NH * Tl),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t t = i % Tl, h = (i / Tl) % NH, b = i / Tl / NH;
        const Real inv = Real(1) / L[i];
        Real* orow = o + (b * Tl + t) * C + h * hs;
        for (int e = 0; e < hs; ++e) orow[e] *= inv;
        M[i] += kmath::log(L[i]);
      });
}

// One ring step's dq: every local query row against the visiting block's keys, += into dqkv's q columns.
template <class Real>
void ring_backward_queries(const View1<Real>& dinp,          // dinp (B,Tl,(NH+2NKV)*hs), q columns +=
                           const View1<const Real>& delta,   // D (B,NH,Tl)
                           const View1<const Real>& dout,    // dout (B,Tl,NH*hs)
                           const View1<const Real>& inp,     // inp (B,Tl,(NH+2NKV)*hs)
                           const View1<const Real>& lse,     // lse (B,NH,Tl)
                           const View1<const Real>& kv,      // kv (B,Tl,2*NKV*hs), the visiting block
                           const RingBlock& r) {
  using namespace flash_detail;
  const int Tl = r.Tl, c = r.c, NH = r.NH, NKV = r.NKV, hs = r.hs, G = NH / NKV, C = NH * hs;
  const int W = (NH + 2 * NKV) * hs, KW = r.kv_width();
  const int tile = QueryGradientScratch<Real>::tile(hs), tiles = (c + tile - 1) / tile;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Real *in = inp.data(), *dO = dout.data(), *Lg = lse.data(), *Dg = delta.data(), *kvp = kv.data();
  Real* din = dinp.data();
  const RingBlock rb = r;
  Policy policy(r.B * NH * 2 * tiles, team_size(tile));
  policy.set_scratch_size(0, Kokkos::PerTeam(QueryGradientScratch<Real>::bytes(tile, hs)));
  Kokkos::parallel_for(
      "fsdpp::ring_attention_backward_queries", policy, KOKKOS_LAMBDA(const Member& team) {
        const int qt = team.league_rank() % (2 * tiles), h = (team.league_rank() / (2 * tiles)) % NH;
        const int b = team.league_rank() / (2 * tiles) / NH, kvh = h / G;
        const int qpart = qt / tiles, q_off = (qt % tiles) * tile;
        const int r0 = qpart * c + q_off, nr = c - q_off < tile ? c - q_off : tile;
        const int P = rb.q_pos(qpart) + q_off;
        const std::int32_t* starts = rb.starts;
        const std::int64_t row0 = std::int64_t(b) * Tl + r0, lrow = (std::int64_t(b) * NH + h) * Tl + r0;
        int spans[2][2];  // the visible key rows of each key chunk
        bool any = false;
        for (int kpart = 0; kpart < 2; ++kpart) {
          ring_detail::visible_keys(P, nr, starts ? starts[row0] : 0, rb.k_pos(kpart), c, tile, spans[kpart][0],
                                    spans[kpart][1]);
          any = any || spans[kpart][0] < spans[kpart][1];
        }
        if (!any) return;  // the whole team leaves together: nothing of this block is visible to the tile
        const QueryGradientScratch<Real> scratch(team, tile, hs);
        Real *sq = scratch.q, *sdo = scratch.dout, *sdq = scratch.dq, *sk = scratch.k, *sv = scratch.v;
        const Real* rows = in + std::int64_t(b) * Tl * W;
        const Real* krows = kvp + std::int64_t(b) * Tl * KW;
        stage(team, sq, rows, r0, nr, W, h * hs, hs);
        stage(team, sdo, dO + std::int64_t(b) * Tl * C, r0, nr, C, h * hs, hs);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](const int e) { sdq[e] = 0; });
        for (int kpart = 0; kpart < 2; ++kpart) {
          const int K0 = rb.k_pos(kpart);
          for (int j0 = spans[kpart][0]; j0 < spans[kpart][1]; j0 += tile) {
            const int nc = c - j0 < tile ? c - j0 : tile;
            team.team_barrier();
            stage(team, sk, krows, kpart * c + j0, nc, KW, kvh * hs, hs);
            stage(team, sv, krows, kpart * c + j0, nc, KW, NKV * hs + kvh * hs, hs);
            team.team_barrier();
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr), [&](const int i) {
              const int start = starts ? starts[row0 + i] : 0;
              backward_query_row(P + i, start, K0 + j0, nc, hs, scale, sq + i * hs, sdo + i * hs, Lg[lrow + i],
                                 Dg[lrow + i], sk, sv, sdq + i * hs);
            });
          }
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nr * hs), [&](const int e) {
          din[(row0 + e / hs) * W + h * hs + e % hs] += sdq[e];
        });
      });
}

// One ring step's dk, dv of the visiting block from every local query, added to the partial sums of the ranks
// before (`partial`, empty at the first step) and written (=) to dkv (B,Tl,2*NKV*hs), the block's [dk | dv] rows
// that the ring passes on.
template <class Real>
void ring_backward_keys(const View1<Real>& dkv,           // dkv (B,Tl,2*NKV*hs), = partial + this rank's part
                        const View1<const Real>& partial, // (B,Tl,2*NKV*hs) or empty
                        const View1<const Real>& delta,   // D (B,NH,Tl)
                        const View1<const Real>& dout,    // dout (B,Tl,NH*hs)
                        const View1<const Real>& inp,     // inp (B,Tl,(NH+2NKV)*hs)
                        const View1<const Real>& lse,     // lse (B,NH,Tl)
                        const View1<const Real>& kv,      // kv (B,Tl,2*NKV*hs), the visiting block
                        const RingBlock& r) {
  using namespace flash_detail;
  const int Tl = r.Tl, c = r.c, NH = r.NH, NKV = r.NKV, hs = r.hs, G = NH / NKV, C = NH * hs;
  const int W = (NH + 2 * NKV) * hs, KW = r.kv_width();
  const int tile = KeyGradientScratch<Real>::tile(hs), tiles = (c + tile - 1) / tile;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const Real *in = inp.data(), *dO = dout.data(), *Lg = lse.data(), *Dg = delta.data(), *kvp = kv.data();
  Real* dkvp = dkv.data();
  const Real* base = partial.extent(0) ? partial.data() : nullptr;
  const RingBlock rb = r;
  Policy policy(r.B * NKV * 2 * tiles, team_size(tile));
  policy.set_scratch_size(0, Kokkos::PerTeam(KeyGradientScratch<Real>::bytes(tile, hs)));
  Kokkos::parallel_for(
      "fsdpp::ring_attention_backward_keys", policy, KOKKOS_LAMBDA(const Member& team) {
        const int kt = team.league_rank() % (2 * tiles), kvh = (team.league_rank() / (2 * tiles)) % NKV;
        const int b = team.league_rank() / (2 * tiles) / NKV;
        const int kpart = kt / tiles, k_off = (kt % tiles) * tile;
        const int k0 = kpart * c + k_off, nc = c - k_off < tile ? c - k_off : tile;  // the block's rows
        const int K = rb.k_pos(kpart) + k_off;                                       // their first position
        const KeyGradientScratch<Real> scratch(team, tile, hs);
        Real *sk = scratch.k, *sv = scratch.v, *sdk = scratch.dk, *sdv = scratch.dv, *sq = scratch.q;
        Real *sdo = scratch.dout, *sL = scratch.lse, *sD = scratch.delta;
        const Real* rows = in + std::int64_t(b) * Tl * W;
        const Real* krows = kvp + std::int64_t(b) * Tl * KW;
        const Real* drows = dO + std::int64_t(b) * Tl * C;
        stage(team, sk, krows, k0, nc, KW, kvh * hs, hs);
        stage(team, sv, krows, k0, nc, KW, NKV * hs + kvh * hs, hs);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc * hs), [&](const int e) { sdk[e] = 0, sdv[e] = 0; });
        for (int h = kvh * G; h < (kvh + 1) * G; ++h) {
          const std::int64_t lrow = (std::int64_t(b) * NH + h) * Tl;
          for (int qpart = 0; qpart < 2; ++qpart) {
            const int Q0 = rb.q_pos(qpart);
            // query tiles of this chunk at or below the key tile's diagonal: the first one holding a query at
            // position >= K (tile-aligned within the chunk)
            const int first = K > Q0 ? (K - Q0) / tile * tile : 0;
            for (int q_off = first; q_off < c; q_off += tile) {
              const int nq = c - q_off < tile ? c - q_off : tile;
              const std::int64_t qrow = std::int64_t(b) * Tl + qpart * c + q_off;
              const std::int32_t* qstarts = rb.starts ? rb.starts + qrow : nullptr;
              if (qstarts && qstarts[0] >= K + nc) break;  // these queries' documents, and later ones', start after
              team.team_barrier();
              stage(team, sq, rows, qpart * c + q_off, nq, W, h * hs, hs);
              stage(team, sdo, drows, qpart * c + q_off, nq, C, h * hs, hs);
              Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nq), [&](const int i) {
                sL[i] = Lg[lrow + qpart * c + q_off + i], sD[i] = Dg[lrow + qpart * c + q_off + i];
              });
              team.team_barrier();
              Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc), [&](const int j) {
                backward_key_row(K + j, Q0 + q_off, nq, hs, scale, sk + j * hs, sv + j * hs, sq, sdo, sL, sD, qstarts,
                                 sdk + j * hs, sdv + j * hs);
              });
            }
          }
        }
        team.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, nc * hs), [&](const int e) {
          const std::int64_t at = (std::int64_t(b) * Tl + k0 + e / hs) * KW + kvh * hs + e % hs;
          dkvp[at] = (base ? base[at] : Real(0)) + sdk[e];
          dkvp[at + NKV * hs] = (base ? base[at + NKV * hs] : Real(0)) + sdv[e];
        });
      });
}

// kv (B,Tl,2*NKV*hs) = the [k | v] columns of inp (B,Tl,(NH+2NKV)*hs): the block this rank sends round the ring.
template <class Real>
void ring_pack_kv(const View1<Real>& kv, const View1<const Real>& inp, const RingBlock& r) {
  const int KW = r.kv_width(), C = r.NH * r.hs, W = C + KW;
  const Real* in = inp.data();
  Real* out = kv.data();
  Kokkos::parallel_for(
      "fsdpp::ring_pack_kv", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(r.B) * r.Tl * KW),
      KOKKOS_LAMBDA(const std::int64_t i) { out[i] = in[(i / KW) * W + C + i % KW]; });
}

// dinp's [dk | dv] columns += dkv (B,Tl,2*NKV*hs): this rank's block's gradient, home from the ring.
template <class Real>
void ring_unpack_dkv(const View1<Real>& dinp, const View1<const Real>& dkv, const RingBlock& r) {
  const int KW = r.kv_width(), C = r.NH * r.hs, W = C + KW;
  Real* din = dinp.data();
  const Real* g = dkv.data();
  Kokkos::parallel_for(
      "fsdpp::ring_unpack_dkv", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(r.B) * r.Tl * KW),
      KOKKOS_LAMBDA(const std::int64_t i) { din[(i / KW) * W + C + i % KW] += g[i]; });
}

}  // namespace fsdpp::kernels

namespace fsdpp::kernels {

// Context parallelism's rows of a batch: for local row n = b*Tl + t, the global position of t (chunks c0 and c1
// of c rows each) and the whole row's token, target and (full_starts given) document start there.
inline void cp_localize(const View1<std::int32_t>& tokens, const View1<std::int32_t>& targets,
                        const View1<std::int32_t>& positions, const View1<std::int32_t>& starts,
                        const View1<const std::int32_t>& full_tokens, const View1<const std::int32_t>& full_targets,
                        const View1<const std::int32_t>& full_starts, int B, int T, int c, int c0, int c1) {
  const int Tl = 2 * c;
  std::int32_t *tok = tokens.data(), *tgt = targets.data(), *pos = positions.data(), *st = starts.data();
  const std::int32_t *ftok = full_tokens.data(), *ftgt = full_targets.data(), *fst = full_starts.data();
  Kokkos::parallel_for(
      "fsdpp::cp_localize", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(B) * Tl), KOKKOS_LAMBDA(const std::int64_t n) {
        const int t = static_cast<int>(n % Tl);
        const std::int64_t b = n / Tl;
        const int p = (t < c ? c0 : c1) * c + t % c;
        const std::int64_t at = b * T + p;
        tok[n] = ftok[at];
        tgt[n] = ftgt[at];
        pos[n] = p;
        if (fst) st[n] = fst[at];
      });
}

// Reproducible chunks' fixed-order attention (ContextParallelGroup::fixed_order_*): every rank's rows, all-gathered
// as `ranks` blocks of (outer, Tl, width), laid out as whole sequences (outer, 2 ranks c, width) in position order.
// Chunk k of c rows is part 0 of rank k, or part 1 of rank 2 ranks - 1 - k.
template <class Real>
void cp_whole_from_gathered(const View1<Real>& whole, const View1<const Real>& gathered, std::int64_t outer, int c,
                            int width, int ranks) {
  const int Tl = 2 * c, T = ranks * Tl;
  Real* w = whole.data();
  const Real* g = gathered.data();
  Kokkos::parallel_for(
      "fsdpp::cp_whole_from_gathered", Kokkos::RangePolicy<ExecSpace>(0, outer * T * width),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const int e = static_cast<int>(i % width);
        const int p = static_cast<int>((i / width) % T);
        const std::int64_t o = i / width / T;
        const int k = p / c, rank = k < ranks ? k : 2 * ranks - 1 - k, t = (k < ranks ? 0 : c) + p % c;
        w[i] = g[((std::int64_t(rank) * outer + o) * Tl + t) * width + e];
      });
}

// This rank's rows (chunks c0 and c1) of whole sequences (outer, T, width) into local (outer, 2c, width): copied,
// or with `add` added.
template <class Real>
void cp_local_from_whole(const View1<Real>& local, const View1<const Real>& whole, std::int64_t outer, int c, int T,
                         int width, int c0, int c1, bool add) {
  const int Tl = 2 * c;
  Real* l = local.data();
  const Real* w = whole.data();
  Kokkos::parallel_for(
      "fsdpp::cp_local_from_whole", Kokkos::RangePolicy<ExecSpace>(0, outer * Tl * width),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const int e = static_cast<int>(i % width);
        const int t = static_cast<int>((i / width) % Tl);
        const std::int64_t o = i / width / Tl;
        const int p = (t < c ? c0 : c1) * c + t % c;
        const Real v = w[(o * T + p) * width + e];
        l[i] = add ? l[i] + v : v;
      });
}

}  // namespace fsdpp::kernels
