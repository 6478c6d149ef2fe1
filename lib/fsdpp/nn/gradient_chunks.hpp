#pragma once
// Reproducible mode's token chunks (train.reproducible_chunks, docs/reproducible.md).
//
// A sum over token rows into a parameter's gradient (a weight gradient's product, a norm's column sums, an
// embedding's scatter) gives other bits when a rank holds another set of a sequence's tokens (mesh.cp): the
// products have other shapes and the partial sums other rows. With chunks on, every such sum runs one chunk of
// `rows` token rows at a time into zeroed scratch, and each chunk's part is cut into the parameter's fixed-point
// words (Parameter::grad_words, which fully_shard hands out during backward). Integer sums do not depend on
// order, so the words are the same whichever rank held which chunk; the products of the rows themselves are
// fixed by the GEMM row blocks (tensor/matmul.hpp, set_gemm_row_block) and the row-wise kernels.
//
//   sequence of T positions:  | chunk 0 | chunk 1 | ... | chunk K-1 |     K = train.reproducible_chunks
//   cp rank r's rows:          the whole chunks of its two parts (K a multiple of 2 cp)
//
// Off (rows 0), a sum goes to the gradients directly, whole, as it always did.
#include "fsdpp/nn/parameter.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/exact_words.hpp"

#include <array>
#include <cstdint>
#include <vector>

namespace fsdpp {

class GradientChunks {
 public:
  // rows: the token rows of one chunk (model.context_length / train.reproducible_chunks); 0 turns chunks off.
  // `elements`: the scratch of each of sum()'s two parameters, the largest that can come first and second (the
  // model's to say: a weight and its bias, a norm's weight and bias, GPT-2's two tables are cut together).
  void configure(int rows, std::array<std::int64_t, 2> elements);
  bool active() const { return rows_ > 0; }
  int rows() const { return rows_; }

  // A gradient sum over `N` token rows into `a` and `b` (nullptr: none). write(ga, gb, row0, rows) adds the
  // part of rows [row0, row0 + rows) to ga and gb (empty views for nullptr). Off: once, into the gradients.
  template <class Write> void sum(const Parameter* a, const Parameter* b, int N, const Write& write) {
    if (!active()) {
      write(grad_of(a), grad_of(b), 0, N);
      return;
    }
    FSDPP_CHECK(N % rows_ == 0, "reproducible chunks: {} token rows are not whole chunks of {}", N, rows_);
    for (int row0 = 0; row0 < N; row0 += rows_) {
      const View1<float> ga = zeroed(0, a), gb = zeroed(1, b);
      write(ga, gb, row0, rows_);
      add(a, ga);
      add(b, gb);
    }
  }

 private:
  static View1<float> grad_of(const Parameter* p) { return p ? p->grad() : View1<float>(); }
  View1<float> zeroed(int slot, const Parameter* p);
  static void add(const Parameter* p, const View1<float>& part);
  int rows_ = 0;
  std::array<std::int64_t, 2> elements_ = {0, 0};
  View1<float> scratch_[2];
};

// Rows [row0, row0 + rows) of a row-major (N, width) matrix held in a flat view.
inline View1<float> chunk_rows(const View1<float>& m, int row0, int rows, int width) {
  const auto first = static_cast<std::size_t>(row0) * static_cast<std::size_t>(width);
  return Kokkos::subview(m, std::make_pair(first, first + static_cast<std::size_t>(rows) * static_cast<std::size_t>(width)));
}
inline View1<const std::int32_t> chunk_rows(const View1<const std::int32_t>& m, int row0, int rows) {
  return Kokkos::subview(m, std::make_pair(static_cast<std::size_t>(row0), static_cast<std::size_t>(row0 + rows)));
}

}  // namespace fsdpp
