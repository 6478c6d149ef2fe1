#pragma once
// GPT-2 causal multi-head self-attention, forward and backward (llm.c's attention_forward/backward, with the
// T x T products done by batched GEMMs instead of loops).
//
// Layout: inp (B,T,3C) holds, per position, q in channels [0,C), k in [C,2C) and v in [2C,3C); head h uses
// channels [h*hs, (h+1)*hs) of each, hs = C/NH. The scores are scaled by 1/sqrt(hs). With grouped-query
// attention (AttentionShape, Llama) a row is [q (NH*hs) | k (NKV*hs) | v (NKV*hs)] and query head h reads
// kv head h / (NH/NKV); NKV = NH gives exactly the GPT-2 products, in the same order.
//
// Memory is O(B*NH*T^2): the softmax probabilities att (B,NH,T,T) are materialised and saved for backward, and
// backward needs a scratch of the same size. flash_attention.hpp recomputes the scores per tile instead and
// is O(B*T*C); attention_batched.hpp runs these products batched over all (batch x head) pairs. This path stays
// the reference (and the CPU default, model.attention).
//
// Causality: only the lower triangle (t2 <= t) of each T x T matrix is used. The products are done in row
// blocks of `row_block` rows, each stopping at the block's last column (forward) or starting at its first row
// (the transposed products of backward), so the GEMMs skip most of the upper triangle; row_block >= T gives
// plain full-size products. Whatever a block computes above the diagonal is overwritten with exact zeros by the
// softmax kernels, so att and the softmax gradient are exactly causal.
//
// Document masks (AttentionShape::starts, document.hpp): the softmax kernels also zero the columns before each
// row's document start, element-wise; the products then carry the mask (zero probabilities, zero gradients).
//
// Ordering: host backends finish a parallel_for before returning, and on CUDA the products run on Kokkos's own
// stream (tensor/matmul.cpp), so no fences are needed between the kernels and the GEMMs.
//
// The template parameter is named Real, not T, because T is the sequence length here.
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/softmax.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cmath>
#include <cstdint>

namespace fsdpp::kernels {

// 64 rows keep each product large enough for the BLAS kernels to run near peak while skipping
// 1 - (n+1)/(2n) of the T x T work for n = T/64 blocks (37.5% at T = 256). Measured forward+backward at
// B=8 T=256 C=256 NH=4, float, one OpenBLAS thread: 14.5-16 ms against 18-22 ms for full products; 32 to 96
// rows are about equally fast, 128 and more lose. The "attention timing" test prints both.
inline constexpr int kAttentionRowBlock = 64;

namespace detail {
// For each row block [r0, r1) of the T x T matrices, in a fixed order.
template <class F> void for_each_causal_row_block(int T, int row_block, F&& f) {
  const int step = row_block > 0 ? row_block : T;
  for (int r0 = 0; r0 < T; r0 += step) f(r0, r0 + step < T ? r0 + step : T);
}
}  // namespace detail

// Grouped-query attention (Llama 2 70B, Llama 3): NKV key/value heads, each shared by G = NH/NKV consecutive
// query heads (query head h reads kv head h / G). NKV = NH is plain multi-head attention (GPT-2).
struct AttentionShape {
  int B = 0, T = 0;
  int NH = 0;   // query heads
  int NKV = 0;  // key/value heads, dividing NH
  int hs = 0;   // head size
  // Document masks (document.hpp): (B*T) device pointer, query t sees keys [starts[b*T+t], t]; nullptr: causal.
  const std::int32_t* starts = nullptr;
  int q_width() const { return NH * hs; }                 // C: the output's row width
  int row_width() const { return (NH + 2 * NKV) * hs; }   // a packed [q | k | v] row
  int group() const { return NH / NKV; }                  // G
};

// Causal softmax over `matrices` T x T matrices, in place: row t ends at column t; the upper triangle
// (garbage or unset from the blocked products) is set to 0. The kernels, tuned and portable, are softmax.hpp's.
template <class Real>
void attention_softmax_forward(const View1<Real>& att, std::int64_t matrices, int T,
                               const std::int32_t* starts = nullptr, int heads = 1) {
  attention_softmax_forward(att.data(), matrices * T, T, starts, heads);
}

// Softmax backward per row, in place in datt: datt = att * (datt - rowsum(att * datt)), reading only t2 <= t
// (above the diagonal datt may hold garbage, even NaN) and writing 0 there.
template <class Real>
void attention_softmax_backward(const View1<Real>& datt, const View1<const Real>& att, std::int64_t matrices, int T,
                                const std::int32_t* starts = nullptr, int heads = 1) {
  attention_softmax_backward(datt.data(), att.data(), matrices * T, T, starts, heads);
}

// out (B,T,NH*hs) = softmax(causal(q k^T / sqrt(hs))) v per query head; att (B,NH,T,T) receives the
// probabilities, exactly 0 above the diagonal, for backward. inp rows are packed [q (NH*hs) | k (NKV*hs) |
// v (NKV*hs)]. The products are batched over the NKV kv heads, once for each of the G query heads of a group
// (strides G*hs in q, hs in k and v): for G = 1 that is one batch over all heads.
template <class Real>
void attention_forward(const View1<Real>& out,        // out (B,T,NH*hs)
                       const View1<Real>& att,        // att (B,NH,T,T)
                       const View1<const Real>& inp,  // inp (B,T,(NH+2NKV)*hs)
                       const AttentionShape& s, int row_block = kAttentionRowBlock) {
  const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, hs = s.hs, G = s.group();
  const int C = s.q_width(), W = s.row_width();
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const std::int64_t TT = std::int64_t(T) * T;

  // Scores: att[b,h,t,t2] = scale * q[b,t,h] . k[b,t2,h/G].
  for (int b = 0; b < B; ++b) {
    const Real* q = inp.data() + std::int64_t(b) * T * W;
    const Real* k = q + C;
    Real* a = att.data() + std::int64_t(b) * NH * TT;
    detail::for_each_causal_row_block(T, row_block, [&](int r0, int r1) {
      for (int j = 0; j < G; ++j)
        gemm_batched(Trans::N, Trans::T, r1 - r0, r1, hs, scale, q + std::int64_t(r0) * W + j * hs, W, G * hs, k, W,
                     hs, Real(0), a + std::int64_t(r0) * T + j * TT, T, G * TT, NKV);
    });
  }

  // Causal softmax over the B*NH*T rows, in place.
  attention_softmax_forward<Real>(att, std::int64_t(B) * NH, T, s.starts, NH);

  // out[b,t,h*hs+i] = sum_t2 att[b,h,t,t2] v[b,t2,(h/G)*hs+i]; row block [r0,r1) needs only columns t2 < r1.
  for (int b = 0; b < B; ++b) {
    const Real* v = inp.data() + std::int64_t(b) * T * W + C + NKV * hs;
    const Real* ab = att.data() + std::int64_t(b) * NH * TT;
    Real* o = out.data() + std::int64_t(b) * T * C;
    detail::for_each_causal_row_block(T, row_block, [&](int r0, int r1) {
      for (int j = 0; j < G; ++j)
        gemm_batched(Trans::N, Trans::N, r1 - r0, hs, r1, Real(1), ab + std::int64_t(r0) * T + j * TT, T, G * TT, v,
                     W, hs, Real(0), o + std::int64_t(r0) * C + j * hs, C, G * hs, NKV);
    });
  }
}

// GPT-2's layout: inp (B,T,3C), NH heads of C/NH, no grouping.
template <class Real>
void attention_forward(const View1<Real>& out, const View1<Real>& att, const View1<const Real>& inp, int B, int T,
                       int C, int NH, int row_block = kAttentionRowBlock) {
  attention_forward<Real>(out, att, inp, AttentionShape{B, T, NH, NH, C / NH}, row_block);
}

// Backward of attention_forward. ACCUMULATES (+=) into dinp (the caller zeroes it); datt is scratch, overwritten.
//   datt = dout_h v^T                                  (gradient of the probabilities)
//   dv  += att^T dout_h                                (summed over the G query heads sharing the kv head)
//   dpre = att * (datt - rowsum(att * datt))           (softmax backward, in place in datt, 0 above the diagonal)
//   dq  += scale * dpre k,   dk += scale * dpre^T q    (dk summed over the group too)
template <class Real>
void attention_backward(const View1<Real>& dinp,        // dinp (B,T,(NH+2NKV)*hs), +=
                        const View1<Real>& datt,        // datt (B,NH,T,T), scratch
                        const View1<const Real>& dout,  // dout (B,T,NH*hs)
                        const View1<const Real>& inp,   // inp (B,T,(NH+2NKV)*hs)
                        const View1<const Real>& att,   // att (B,NH,T,T), from attention_forward
                        const AttentionShape& s, int row_block = kAttentionRowBlock) {
  const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, hs = s.hs, G = s.group();
  const int C = s.q_width(), W = s.row_width(), KC = NKV * hs;
  const Real scale = Real(1) / std::sqrt(Real(hs));
  const std::int64_t TT = std::int64_t(T) * T;

  for (int b = 0; b < B; ++b) {
    const Real* v = inp.data() + std::int64_t(b) * T * W + C + KC;
    const Real* ab = att.data() + std::int64_t(b) * NH * TT;
    const Real* dob = dout.data() + std::int64_t(b) * T * C;
    Real* dab = datt.data() + std::int64_t(b) * NH * TT;
    Real* dv = dinp.data() + std::int64_t(b) * T * W + C + KC;
    detail::for_each_causal_row_block(T, row_block, [&](int r0, int r1) {
      for (int j = 0; j < G; ++j) {
        // datt rows [r0,r1), columns t2 < r1 (the rest is never read).
        gemm_batched(Trans::N, Trans::T, r1 - r0, r1, hs, Real(1), dob + std::int64_t(r0) * C + j * hs, C, G * hs, v,
                     W, hs, Real(0), dab + std::int64_t(r0) * T + j * TT, T, G * TT, NKV);
        // dv rows t2 in [r0,r1) sum over t >= r0 only: att[t,t2] = 0 for t < t2.
        gemm_batched(Trans::T, Trans::N, r1 - r0, hs, T - r0, Real(1), ab + std::int64_t(r0) * T + r0 + j * TT, T,
                     G * TT, dob + std::int64_t(r0) * C + j * hs, C, G * hs, Real(1), dv + std::int64_t(r0) * W, W, hs,
                     NKV);
      }
    });
  }

  // Softmax backward per row, in place in datt.
  attention_softmax_backward<Real>(datt, att, std::int64_t(B) * NH, T, s.starts, NH);

  for (int b = 0; b < B; ++b) {
    const Real* q = inp.data() + std::int64_t(b) * T * W;
    const Real* k = q + C;
    const Real* dab = datt.data() + std::int64_t(b) * NH * TT;
    Real* dq = dinp.data() + std::int64_t(b) * T * W;
    Real* dk = dq + C;
    detail::for_each_causal_row_block(T, row_block, [&](int r0, int r1) {
      for (int j = 0; j < G; ++j) {
        // dq rows [r0,r1) need keys t2 < r1; dk rows t2 in [r0,r1) need queries t >= r0.
        gemm_batched(Trans::N, Trans::N, r1 - r0, hs, r1, scale, dab + std::int64_t(r0) * T + j * TT, T, G * TT, k, W,
                     hs, Real(1), dq + std::int64_t(r0) * W + j * hs, W, G * hs, NKV);
        gemm_batched(Trans::T, Trans::N, r1 - r0, hs, T - r0, scale, dab + std::int64_t(r0) * T + r0 + j * TT, T,
                     G * TT, q + std::int64_t(r0) * W + j * hs, W, G * hs, Real(1), dk + std::int64_t(r0) * W, W, hs,
                     NKV);
      }
    });
  }
}

// GPT-2's layout: inp (B,T,3C), NH heads of C/NH, no grouping.
template <class Real>
void attention_backward(const View1<Real>& dinp, const View1<Real>& datt, const View1<const Real>& dout,
                        const View1<const Real>& inp, const View1<const Real>& att, int B, int T, int C, int NH,
                        int row_block = kAttentionRowBlock) {
  attention_backward<Real>(dinp, datt, dout, inp, att, AttentionShape{B, T, NH, NH, C / NH}, row_block);
}

}  // namespace fsdpp::kernels
