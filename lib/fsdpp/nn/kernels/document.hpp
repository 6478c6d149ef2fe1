#pragma once
// Document starts of packed sequences (data.document_mask, docs/models-and-data.md "Document masks"): a row of T
// input tokens holds several documents, each ended by the end-of-text token, which belongs to the document it
// ends. Token t starts a new document when token t-1 is the end-of-text id (t = 0 always starts one), and
//   starts[b*T + t] = the first position of t's document,
// so that key j is visible to query t iff starts[t] <= j <= t (attention.hpp, flash_attention.hpp), and with
// reset positions RoPE rotates t by t - starts[t] (rope.hpp). starts is non-decreasing along a row, which is what
// lets the fused kernels skip whole key tiles before a query tile's first start.
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

// starts (B*T) from tokens (B*T). A team per row; one thread of it carries the running start along the row: T
// integer steps per row, nothing next to one attention layer, and the same code (and result) on every backend.
inline void document_starts(const View1<std::int32_t>& starts, const View1<const std::int32_t>& tokens, int B, int T,
                            std::int32_t eot_id) {
  std::int32_t* s = starts.data();
  const std::int32_t* tok = tokens.data();
  using Policy = Kokkos::TeamPolicy<ExecSpace>;
  Kokkos::parallel_for(
      "fsdpp::document_starts", Policy(B, 1), KOKKOS_LAMBDA(const Policy::member_type& team) {
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          const std::int64_t row = std::int64_t(team.league_rank()) * T;
          std::int32_t start = 0;
          for (int t = 0; t < T; ++t) {
            if (t > 0 && tok[row + t - 1] == eot_id) start = t;
            s[row + t] = start;
          }
        });
      });
}

}  // namespace fsdpp::kernels
