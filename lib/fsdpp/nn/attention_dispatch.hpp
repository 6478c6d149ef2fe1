#pragma once
// The blocks' one entry to causal attention: model.attention (attention_kind.hpp) picks the kernels.
//   saved:     what backward reads: the probabilities (B,NH,T,T), or the fused kernels' logsumexp (B,NH,T)
//   scratch:   backward's (B,NH,T,T) probability gradients, or the fused kernels' row term (B,NH,T)
//   workspace: attention_workspace_floats; used by the batched kernels only
#include "fsdpp/nn/attention_kind.hpp"
#include "fsdpp/nn/kernels/attention.hpp"
#include "fsdpp/nn/kernels/attention_batched.hpp"
#include "fsdpp/nn/kernels/flash_attention.hpp"

namespace fsdpp {

inline void attention_forward_as(AttentionKind kind, const View1<float>& out, const View1<float>& saved,
                                 const View1<const float>& inp, const View1<float>& workspace,
                                 const kernels::AttentionShape& s) {
  switch (resolve_attention(kind)) {
    case AttentionKind::fused: return kernels::flash_attention_forward<float>(out, saved, inp, s);
    case AttentionKind::batched: return kernels::attention_forward_batched<float>(out, saved, inp, workspace, s);
    default: return kernels::attention_forward<float>(out, saved, inp, s);
  }
}

// ACCUMULATES (+=) into dinp, like the kernels.
inline void attention_backward_as(AttentionKind kind, const View1<float>& dinp, const View1<float>& scratch,
                                  const View1<const float>& dout, const View1<const float>& inp,
                                  const View1<const float>& out, const View1<const float>& saved,
                                  const View1<float>& workspace, const kernels::AttentionShape& s) {
  switch (resolve_attention(kind)) {
    case AttentionKind::fused: return kernels::flash_attention_backward<float>(dinp, scratch, dout, inp, out, saved, s);
    case AttentionKind::batched:
      return kernels::attention_backward_batched<float>(dinp, scratch, dout, inp, saved, workspace, s);
    default: return kernels::attention_backward<float>(dinp, scratch, dout, inp, saved, s);
  }
}

}  // namespace fsdpp
