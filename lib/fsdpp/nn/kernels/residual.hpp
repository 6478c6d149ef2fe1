#pragma once
// Residual connection out = a + b. Its backward hands dout unchanged to both inputs, so it is two
// accumulations: residual_backward does both in one pass over dout, accumulate does one.
//
// Backward ACCUMULATES (+=) into da, db and dst; the caller zeroes them (or pre-loads another path's gradient).
// out may alias a or b (elementwise); dst must not alias src.
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

// out = a + b, elementwise
template <class T>
void residual_forward(const View1<T>& out,      // out (N)
                      const View1<const T>& a,  // a (N)
                      const View1<const T>& b,  // b (N)
                      int N) {
  Kokkos::parallel_for(
      "fsdpp::residual_forward", Kokkos::RangePolicy<ExecSpace>(0, detail::element_blocks(N)),
      KOKKOS_LAMBDA(const int block) {
        const T* x = a.data();
        const T* y = b.data();
        T* o = out.data();
        for (std::int64_t i = detail::block_begin(block), e = detail::block_end(block, N); i < e; ++i) o[i] = x[i] + y[i];
      });
}

// dst += src, elementwise
template <class T>
void accumulate(const View1<T>& dst,        // dst (N), +=
                const View1<const T>& src,  // src (N)
                int N) {
  Kokkos::parallel_for(
      "fsdpp::accumulate", Kokkos::RangePolicy<ExecSpace>(0, detail::element_blocks(N)),
      KOKKOS_LAMBDA(const int block) {
        const T* g = src.data();
        T* d = dst.data();
        for (std::int64_t i = detail::block_begin(block), e = detail::block_end(block, N); i < e; ++i) d[i] += g[i];
      });
}

// da += dout;  db += dout
template <class T>
void residual_backward(const View1<T>& da,          // da (N), +=
                       const View1<T>& db,          // db (N), +=
                       const View1<const T>& dout,  // dout (N)
                       int N) {
  Kokkos::parallel_for(
      "fsdpp::residual_backward", Kokkos::RangePolicy<ExecSpace>(0, detail::element_blocks(N)),
      KOKKOS_LAMBDA(const int block) {
        const T* g = dout.data();
        T* x = da.data();
        T* y = db.data();
        for (std::int64_t i = detail::block_begin(block), e = detail::block_end(block, N); i < e; ++i) {
          x[i] += g[i];
          y[i] += g[i];
        }
      });
}

}  // namespace fsdpp::kernels
