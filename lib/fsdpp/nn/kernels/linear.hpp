#pragma once
// Fully connected layer, weights stored (OC,C) as PyTorch's nn.Linear and llm.c: out = inp @ weight^T + bias.
// The products go through fsdpp::gemm (OpenBLAS or cuBLAS, tensor/matmul.hpp).
//
// Backward ACCUMULATES (+=) into dinp, dweight and dbias: the GEMMs run with beta = 1, so gradient accumulation
// over micro-batches and the sum of several consumers of one activation come for free. The caller zeroes.
//
// An empty bias view (extent 0) means the layer has no bias (GPT-2's tied lm head); pass an empty dbias then.
//
// Ordering: host backends finish a parallel_for before returning, and on CUDA the GEMMs run on Kokkos's own
// stream, so kernels and products need no fences between them.
//
// Portable path (team.hpp): the bias add is one team per row, threads over the columns (bitwise the tuned
// result); dbias is team::column_sum (bitwise the same on every launch).
#include "fsdpp/nn/kernels/detail.hpp"
#include "fsdpp/nn/kernels/team.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::kernels {

// Column slices: a projection may write into (and read its gradient from) columns [at, at + OC) of rows of width
// ld, so that several projections fill one packed row (Llama's q, k and v into [q | k | v]); ld = OC, at = 0 is a
// plain (N,OC) matrix. The same kernels either way, so a slice computes the bits a whole matrix would.

// out[n, at:at+OC] += bias (a row-parallel Linear adds its replicated bias once, after the all-reduce of its output)
template <class T>
void bias_forward(const View1<T>& out,             // out (N,ld), columns at..at+OC, +=
                  const View1<const T>& bias,      // bias (OC)
                  int N, int OC, int ld, int at) {
  if (portable()) {
    Kokkos::parallel_for(
        "fsdpp::linear_forward_bias_team", team::row_policy<T>(N, 0), KOKKOS_LAMBDA(const team::Member& member) {
          T* o = out.data() + static_cast<std::int64_t>(member.league_rank()) * ld + at;
          const T* b = bias.data();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(member, OC), [&](const int j) { o[j] += b[j]; });
        });
    return;
  }
  Kokkos::parallel_for(
      "fsdpp::linear_forward", Kokkos::RangePolicy<ExecSpace>(0, N), KOKKOS_LAMBDA(const int n) {
        T* o = out.data() + static_cast<std::int64_t>(n) * ld + at;
        const T* b = bias.data();
        for (int j = 0; j < OC; ++j) o[j] += b[j];
      });
}
template <class T> void bias_forward(const View1<T>& out, const View1<const T>& bias, int N, int OC) {
  bias_forward<T>(out, bias, N, OC, OC, 0);
}

// dbias += sum_n dout[n, at:at+OC]
template <class T>
void bias_backward(const View1<T>& dbias,          // dbias (OC), +=
                   const View1<const T>& dout,     // dout (N,ld), columns at..at+OC
                   int N, int OC, int ld, int at) {
  using detail::kColumnTile;
  if (portable()) {
    const T* g = dout.data() + at;
    team::column_sum<T>(dbias, N, OC, KOKKOS_LAMBDA(int n, int j) { return g[static_cast<std::int64_t>(n) * ld + j]; });
    return;
  }
  Kokkos::parallel_for(
      "fsdpp::linear_backward", Kokkos::RangePolicy<ExecSpace>(0, detail::column_tiles(OC)),
      KOKKOS_LAMBDA(const int tile) {
        const int j0 = detail::tile_begin(tile), w = detail::tile_end(tile, OC) - j0;
        T acc[kColumnTile];
        for (int j = 0; j < w; ++j) acc[j] = T(0);
        for (int n = 0; n < N; ++n) {
          const T* g = dout.data() + static_cast<std::int64_t>(n) * ld + at + j0;
          for (int j = 0; j < w; ++j) acc[j] += g[j];
        }
        for (int j = 0; j < w; ++j) dbias(j0 + j) += acc[j];
      });
}

// out[:, at:at+OC] = inp @ weight^T (+ bias)
template <class T>
void linear_forward(const View1<T>& out,             // out (N,ld), columns at..at+OC
                    const View1<const T>& inp,       // inp (N,C)
                    const View1<const T>& weight,    // weight (OC,C)
                    const View1<const T>& bias,      // bias (OC), or empty for none
                    int N, int C, int OC, int ld, int at) {
  // The bias is added by a pass after the product. Pre-loading it into out for a beta = 1 GEMM measured the
  // same (N=2048, C=256, OC=1024, one OpenBLAS thread: 9.45 against 9.49 ms median, run-to-run noise ~1%, the
  // GEMM alone 9.2 ms): either way out is written once more than by the GEMM alone. This order keeps the GEMM
  // from reading out's stale contents.
  gemm<T>(Trans::N, Trans::T, N, OC, C, T(1), inp.data(), C, weight.data(), C, T(0), out.data() + at, ld);
  if (bias.extent(0) != 0) bias_forward<T>(out, bias, N, OC, ld, at);
}
// out = inp @ weight^T (+ bias), out (N,OC)
template <class T>
void linear_forward(const View1<T>& out, const View1<const T>& inp, const View1<const T>& weight,
                    const View1<const T>& bias, int N, int C, int OC) {
  linear_forward<T>(out, inp, weight, bias, N, C, OC, OC, 0);
}

// Backward in two halves, so that tensor parallelism can start the all-reduce of dinp (which needs every dinp
// of a region) before the weight gradients are computed, and compute them while it runs (Megatron's overlap).
// Each half is one of linear_backward's GEMMs, whole: never split into row chunks, since OpenBLAS's blocking
// depends on M and chunked products would not be bitwise the whole one.

// dinp += dout[:, at:at+OC] @ weight
template <class T>
void linear_backward_input(const View1<T>& dinp,           // dinp (N,C), +=
                           const View1<const T>& dout,     // dout (N,ld), columns at..at+OC
                           const View1<const T>& weight,   // weight (OC,C)
                           int N, int C, int OC, int ld, int at) {
  gemm<T>(Trans::N, Trans::N, N, C, OC, T(1), dout.data() + at, ld, weight.data(), C, T(1), dinp.data(), C);
}
// The same for dout (N,OC)
template <class T>
void linear_backward_input(const View1<T>& dinp, const View1<const T>& dout, const View1<const T>& weight, int N, int C,
                           int OC) {
  linear_backward_input<T>(dinp, dout, weight, N, C, OC, OC, 0);
}

// dweight += dout[:, at:at+OC]^T @ inp;  dbias += sum_n dout[n, at:at+OC]
template <class T>
void linear_backward_weight(const View1<T>& dweight,        // dweight (OC,C), +=
                            const View1<T>& dbias,          // dbias (OC), +=, or empty for none
                            const View1<const T>& dout,     // dout (N,ld), columns at..at+OC
                            const View1<const T>& inp,      // inp (N,C)
                            int N, int C, int OC, int ld, int at) {
  gemm<T>(Trans::T, Trans::N, OC, C, N, T(1), dout.data() + at, ld, inp.data(), C, T(1), dweight.data(), C);
  if (dbias.extent(0) != 0) bias_backward<T>(dbias, dout, N, OC, ld, at);
}
// The same for dout (N,OC)
template <class T>
void linear_backward_weight(const View1<T>& dweight, const View1<T>& dbias, const View1<const T>& dout,
                            const View1<const T>& inp, int N, int C, int OC) {
  linear_backward_weight<T>(dweight, dbias, dout, inp, N, C, OC, OC, 0);
}

// Both halves: dinp += dout[:, at:at+OC] @ weight;  dweight += dout[:, at:at+OC]^T @ inp;  dbias += sum_n dout
template <class T>
void linear_backward(const View1<T>& dinp,           // dinp (N,C), +=
                     const View1<T>& dweight,        // dweight (OC,C), +=
                     const View1<T>& dbias,          // dbias (OC), +=, or empty for none
                     const View1<const T>& dout,     // dout (N,ld), columns at..at+OC
                     const View1<const T>& inp,      // inp (N,C)
                     const View1<const T>& weight,   // weight (OC,C)
                     int N, int C, int OC, int ld, int at) {
  linear_backward_input<T>(dinp, dout, weight, N, C, OC, ld, at);
  linear_backward_weight<T>(dweight, dbias, dout, inp, N, C, OC, ld, at);
}
// The same for dout (N,OC)
template <class T>
void linear_backward(const View1<T>& dinp, const View1<T>& dweight, const View1<T>& dbias, const View1<const T>& dout,
                     const View1<const T>& inp, const View1<const T>& weight, int N, int C, int OC) {
  linear_backward<T>(dinp, dweight, dbias, dout, inp, weight, N, C, OC, OC, 0);
}

}  // namespace fsdpp::kernels
