#pragma once
// SwiGLU, Llama's MLP nonlinearity: out = silu(gate) * up, silu(a) = a * sigmoid(a), elementwise over the
// outputs of gate_proj and up_proj (each (N,F)). sigmoid goes through detail::exp_fast as GELU does (float on a
// host vectorizes; double keeps the library exp for the finite-difference tests).
//
// Backward ACCUMULATES (+=) into dgate and dup; the caller zeroes them.
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

// out = gate * sigmoid(gate) * up
template <class T>
void swiglu_forward(const View1<T>& out,          // out (N*F)
                    const View1<const T>& gate,   // gate (N*F)
                    const View1<const T>& up,     // up (N*F)
                    std::int64_t n) {
  if (portable()) {  // one element per work item, the library exp: what a GPU build runs
    Kokkos::parallel_for(
        "fsdpp::swiglu_forward_elements", Kokkos::RangePolicy<ExecSpace>(0, n), KOKKOS_LAMBDA(const std::int64_t i) {
          out(i) = gate(i) / (T(1) + kmath::exp(-gate(i))) * up(i);
        });
    return;
  }
  Kokkos::parallel_for(
      "fsdpp::swiglu_forward", Kokkos::RangePolicy<ExecSpace>(0, detail::element_blocks(n)),
      KOKKOS_LAMBDA(const int block) {
        const T* a = gate.data();
        const T* u = up.data();
        T* o = out.data();
        for (std::int64_t i = detail::block_begin(block), e = detail::block_end(block, n); i < e; ++i)
          o[i] = a[i] / (T(1) + detail::exp_fast(-a[i])) * u[i];
      });
}

// With s = sigmoid(gate):  dup += dout * gate * s,  dgate += dout * up * s * (1 + gate * (1 - s))
template <class T>
void swiglu_backward(const View1<T>& dgate,         // dgate (N*F), +=
                     const View1<T>& dup,           // dup (N*F), +=
                     const View1<const T>& dout,    // dout (N*F)
                     const View1<const T>& gate,    // gate (N*F)
                     const View1<const T>& up,      // up (N*F)
                     std::int64_t n) {
  if (portable()) {
    Kokkos::parallel_for(
        "fsdpp::swiglu_backward_elements", Kokkos::RangePolicy<ExecSpace>(0, n), KOKKOS_LAMBDA(const std::int64_t i) {
          const T a = gate(i), s = T(1) / (T(1) + kmath::exp(-a));
          dup(i) += dout(i) * a * s;
          dgate(i) += dout(i) * up(i) * s * (T(1) + a * (T(1) - s));
        });
    return;
  }
  Kokkos::parallel_for(
      "fsdpp::swiglu_backward", Kokkos::RangePolicy<ExecSpace>(0, detail::element_blocks(n)),
      KOKKOS_LAMBDA(const int block) {
        const T* a = gate.data();
        const T* u = up.data();
        const T* g = dout.data();
        T* da = dgate.data();
        T* du = dup.data();
        for (std::int64_t i = detail::block_begin(block), e = detail::block_end(block, n); i < e; ++i) {
          const T s = T(1) / (T(1) + detail::exp_fast(-a[i]));
          du[i] += g[i] * a[i] * s;
          da[i] += g[i] * u[i] * s * (T(1) + a[i] * (T(1) - s));
        }
      });
}

}  // namespace fsdpp::kernels
