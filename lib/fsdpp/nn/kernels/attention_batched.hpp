#pragma once
// Causal attention with strided-batched GEMMs over all (batch x head) pairs at once: attention.hpp's products
// and softmax, but on head-major copies of q, k and v, so that one stride steps over every (b, kv head) pair.
// Per product and row block that is G calls (one per query head of a group) instead of B * G: at B 8, T 1024,
// G 1 and 64-row blocks, 96 calls per layer and step instead of 768. row_block >= T gives 6 full-size products
// per layer. Same results as attention_forward/backward to rounding (the sums run in another order).
//
// Head-major layout ("heads"): [q (B,NH,T,hs) | k (B,NKV,T,hs) | v (B,NKV,T,hs)], N*W floats for the packed
// rows (B,T,W), W = (NH+2NKV)*hs; for rows of width C = NH*hs (out, dout) only the q part. Query head
// h = kvh*G + j of batch b sits at matrix (b*NKV + kvh)*G + j, so with the matrix stride G*T*hs, offset j*T*hs,
// it lines up with kv matrix b*NKV + kvh (stride T*hs) and probabilities (stride G*T*T, offset j*T*T).
//
// The caller gives a workspace of batched_attention_workspace(s) floats, kept between steps (no per-step
// allocation); it holds nothing from forward to backward, so the blocks share one. Document masks
// (AttentionShape::starts) are applied by the softmax kernels, element-wise, as in attention.hpp.
#include "fsdpp/nn/kernels/attention.hpp"

namespace fsdpp::kernels {

// Floats of workspace attention_forward_batched and attention_backward_batched need.
inline std::int64_t batched_attention_workspace(const AttentionShape& s) {
  const std::int64_t N = std::int64_t(s.B) * s.T;
  return 2 * N * s.row_width() + N * s.q_width();
}

namespace detail {

// rows (B,T,width) <-> heads; width is W (q, k, v) or C (q only). to_rows: assign, or accumulate (+=).
enum class HeadCopy { to_heads, to_rows, add_to_rows };

// One work item per (row, head): a contiguous copy of hs values, so a CPU vectorizes it and no index is
// divided per element (that made the copies cost more than the products).
template <class Real>
void copy_heads(HeadCopy dir, Real* heads, Real* rows, int width, const AttentionShape& s) {
  const int T = s.T, NH = s.NH, NKV = s.NKV, hs = s.hs, per_row = width / hs;  // NH, or NH + 2 NKV
  const std::int64_t N = std::int64_t(s.B) * T, q_part = N * NH * hs, k_part = N * NKV * hs;
  Kokkos::parallel_for(
      "fsdpp::attention_copy_heads", Kokkos::RangePolicy<ExecSpace>(0, N * per_row),
      KOKKOS_LAMBDA(const std::int64_t item) {
        const std::int64_t n = item / per_row, b = n / T, t = n % T;
        const int g = static_cast<int>(item % per_row);  // head g of the row: q heads, then k, then v
        const std::int64_t at = g < NH ? ((b * NH + g) * T + t) * hs
                                       : q_part + (g - NH) / NKV * k_part + ((b * NKV + (g - NH) % NKV) * T + t) * hs;
        Real* h = heads + at;
        Real* r = rows + n * width + std::int64_t(g) * hs;
        if (dir == HeadCopy::to_heads)
          for (int i = 0; i < hs; ++i) h[i] = r[i];
        else if (dir == HeadCopy::to_rows)
          for (int i = 0; i < hs; ++i) r[i] = h[i];
        else
          for (int i = 0; i < hs; ++i) r[i] += h[i];
      });
}

}  // namespace detail

// attention_forward's result (out, att) through head-major copies; workspace: batched_attention_workspace(s).
template <class Real>
void attention_forward_batched(const View1<Real>& out,        // out (B,T,NH*hs)
                               const View1<Real>& att,        // att (B,NH,T,T)
                               const View1<const Real>& inp,  // inp (B,T,(NH+2NKV)*hs)
                               const View1<Real>& workspace, const AttentionShape& s,
                               int row_block = kAttentionRowBlock) {
  const int T = s.T, hs = s.hs, G = s.group(), BK = s.B * s.NKV;
  const std::int64_t N = std::int64_t(s.B) * T, TT = std::int64_t(T) * T, Ths = std::int64_t(T) * hs;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  Real* q = workspace.data();
  Real* k = q + N * s.q_width();
  Real* v = k + N * s.NKV * hs;
  Real* o = q + N * s.row_width();  // (B,NH,T,hs)
  detail::copy_heads<Real>(detail::HeadCopy::to_heads, q, const_cast<Real*>(inp.data()), s.row_width(), s);
  Real* a = att.data();
  detail::for_each_causal_row_block(T, row_block, [&](int r0, int r1) {
    for (int j = 0; j < G; ++j)
      gemm_batched(Trans::N, Trans::T, r1 - r0, r1, hs, scale, q + (j * T + r0) * std::int64_t(hs), hs, G * Ths, k,
                   hs, Ths, Real(0), a + std::int64_t(r0) * T + j * TT, T, G * TT, BK);
  });
  attention_softmax_forward<Real>(att, std::int64_t(s.B) * s.NH, T, s.starts, s.NH);
  detail::for_each_causal_row_block(T, row_block, [&](int r0, int r1) {
    for (int j = 0; j < G; ++j)
      gemm_batched(Trans::N, Trans::N, r1 - r0, hs, r1, Real(1), a + std::int64_t(r0) * T + j * TT, T, G * TT, v, hs,
                   Ths, Real(0), o + (j * T + r0) * std::int64_t(hs), hs, G * Ths, BK);
  });
  detail::copy_heads<Real>(detail::HeadCopy::to_rows, o, out.data(), s.q_width(), s);
}

// attention_backward's result: ACCUMULATES (+=) into dinp; datt is scratch; workspace as for forward.
template <class Real>
void attention_backward_batched(const View1<Real>& dinp,        // dinp (B,T,(NH+2NKV)*hs), +=
                                const View1<Real>& datt,        // datt (B,NH,T,T), scratch
                                const View1<const Real>& dout,  // dout (B,T,NH*hs)
                                const View1<const Real>& inp,   // inp (B,T,(NH+2NKV)*hs)
                                const View1<const Real>& att,   // att (B,NH,T,T), from the forward
                                const View1<Real>& workspace, const AttentionShape& s,
                                int row_block = kAttentionRowBlock) {
  const int T = s.T, hs = s.hs, G = s.group(), BK = s.B * s.NKV;
  const std::int64_t N = std::int64_t(s.B) * T, TT = std::int64_t(T) * T, Ths = std::int64_t(T) * hs;
  const std::int64_t NW = N * s.row_width();
  const Real scale = Real(1) / std::sqrt(Real(hs));
  Real* q = workspace.data();
  Real* k = q + N * s.q_width();
  Real* v = k + N * s.NKV * hs;
  Real* dq = q + NW;  // [dq | dk | dv] heads, then dout heads
  Real* dk = dq + N * s.q_width();
  Real* dv = dk + N * s.NKV * hs;
  Real* dO = dq + NW;
  detail::copy_heads<Real>(detail::HeadCopy::to_heads, q, const_cast<Real*>(inp.data()), s.row_width(), s);
  detail::copy_heads<Real>(detail::HeadCopy::to_heads, dO, const_cast<Real*>(dout.data()), s.q_width(), s);
  Kokkos::deep_copy(Kokkos::subview(workspace, std::make_pair(NW, 2 * NW)), Real(0));
  const Real* a = att.data();
  Real* d = datt.data();
  detail::for_each_causal_row_block(T, row_block, [&](int r0, int r1) {
    for (int j = 0; j < G; ++j) {
      const std::int64_t qo = (j * T + r0) * std::int64_t(hs), ao = std::int64_t(r0) * T + j * TT;
      gemm_batched(Trans::N, Trans::T, r1 - r0, r1, hs, Real(1), dO + qo, hs, G * Ths, v, hs, Ths, Real(0), d + ao,
                   T, G * TT, BK);
      gemm_batched(Trans::T, Trans::N, r1 - r0, hs, T - r0, Real(1), a + ao + r0, T, G * TT, dO + qo, hs, G * Ths,
                   Real(1), dv + std::int64_t(r0) * hs, hs, Ths, BK);
    }
  });
  attention_softmax_backward<Real>(datt, att, std::int64_t(s.B) * s.NH, T, s.starts, s.NH);
  detail::for_each_causal_row_block(T, row_block, [&](int r0, int r1) {
    for (int j = 0; j < G; ++j) {
      const std::int64_t qo = (j * T + r0) * std::int64_t(hs), ao = std::int64_t(r0) * T + j * TT;
      gemm_batched(Trans::N, Trans::N, r1 - r0, hs, r1, scale, d + ao, T, G * TT, k, hs, Ths, Real(1), dq + qo, hs,
                   G * Ths, BK);
      gemm_batched(Trans::T, Trans::N, r1 - r0, hs, T - r0, scale, d + ao + r0, T, G * TT, q + qo, hs, G * Ths,
                   Real(1), dk + std::int64_t(r0) * hs, hs, Ths, BK);
    }
  });
  detail::copy_heads<Real>(detail::HeadCopy::add_to_rows, dq, dinp.data(), s.row_width(), s);
}

}  // namespace fsdpp::kernels
