#include "fsdpp/nn/attention_kind.hpp"

#include "fsdpp/tensor/types.hpp"

namespace fsdpp {

AttentionKind resolve_attention(AttentionKind k) {
  if (k != AttentionKind::automatic) return k;
#if defined(FSDPP_DEVICE_BUILD)
  return AttentionKind::fused;
#else
  return AttentionKind::reference;
#endif
}

}  // namespace fsdpp
