#pragma once
// model.attention: which causal-attention kernels the blocks run.
//   reference: attention.hpp, row-blocked GEMMs; saves the probabilities att (B,NH,T,T) and needs a scratch of
//              the same size in backward.
//   batched:   attention_batched.hpp, the reference's products as strided-batched GEMMs over all (batch x head)
//              pairs on head-major copies: far fewer GEMM calls (a GPU's launch overhead); the same saved
//              probabilities, plus a workspace of 2*B*T*(NH+2NKV)*hs + B*T*C floats shared by the blocks.
//   fused:     flash_attention.hpp, tiles in team scratch and online softmax; saves only the row logsumexp
//              (B,NH,T), recomputes the probabilities in backward: no B*NH*T^2 buffer at all.
//   automatic: fused on GPU builds; reference on host builds, where it is faster (OpenBLAS products against
//              the fused kernel's scalar loops) and keeps host losses bitwise as before.
#include "fsdpp/config/deck_enums.hpp"  // AttentionKind, the deck's model.attention

#include <cstdint>

namespace fsdpp {

// What automatic means in this build (attention_kind.cpp, where the Kokkos backends are known).
AttentionKind resolve_attention(AttentionKind k);

// Floats per (b, h, query row) that forward saves for backward, and likewise for backward's scratch: T for
// the reference (a row of probabilities), 1 for the fused kernel (the logsumexp L, then the row term D).
inline std::int64_t attention_row_floats(AttentionKind k, int T) {
  return resolve_attention(k) == AttentionKind::fused ? 1 : T;
}

// Floats of the workspace the batched kernels need (0 for the others): attention_batched.hpp.
inline std::int64_t attention_workspace_floats(AttentionKind k, int B, int T, int row_width, int q_width) {
  if (resolve_attention(k) != AttentionKind::batched) return 0;
  const std::int64_t N = std::int64_t{B} * T;
  return 2 * N * row_width + N * q_width;
}

}  // namespace fsdpp
