#pragma once
// Reproducible mode's kernels on a group's fixed-point gradient words (tensor/fixed_point.hpp), for
// fully_shard's exact reduction: cutting whole gradients into slot-ordered words, summing words, and the mean
// of summed words back in f32. The model's token chunks (train.reproducible_chunks) add each chunk's gradient
// into the same words (SlotWords, which fully_shard hands each parameter during backward).
#include "fsdpp/tensor/fixed_point.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp {

// Cuts a whole (padded) gradient into the words of its pieces, slot by slot: element e, in
// chunk q = e / piece, lands at word pair q * slot + offset + e mod piece, as pack_all_slots places floats.
inline void cut_into_slots(const View1<std::int64_t>& words, const View1<float>& whole, std::int64_t piece,
                           std::int64_t offset, std::int64_t slot) {
  if (whole.extent(0) == 0) return;
  const auto w = words;
  const auto g = whole;
  Kokkos::parallel_for("fsdpp::exact_cut_gradient", Kokkos::RangePolicy<ExecSpace>(0, whole.extent(0)),
                       KOKKOS_LAMBDA(const std::size_t e) {
                         const std::int64_t i = static_cast<std::int64_t>(e), q = i / piece, k = i % piece;
                         GradientWords::cut(g(e), &w((q * slot + offset + k) * GradientWords::words));
                       });
}

// Where one parameter's whole gradient lands in its group's slot-ordered words (cut_into_slots' layout): the
// pieces of `piece` elements, the parameter's words at `offset` of each slot of `slot` elements.
struct SlotWords {
  View1<std::int64_t> words;
  std::int64_t piece = 0, offset = 0, slot = 0;
  bool active() const { return words.extent(0) != 0; }
};

// Adds the words of `gradient` (a whole gradient, or one token chunk's part of it) to `into`: each element cut on
// its own, so any split of a sum into parts added this way gives the same integers as the same parts would on
// any other rank.
inline void add_cut_into_slots(const SlotWords& into, const View1<const float>& gradient) {
  if (gradient.extent(0) == 0) return;
  const auto w = into.words;
  const auto g = gradient;
  const std::int64_t piece = into.piece, offset = into.offset, slot = into.slot;
  Kokkos::parallel_for("fsdpp::exact_add_cut_gradient", Kokkos::RangePolicy<ExecSpace>(0, gradient.extent(0)),
                       KOKKOS_LAMBDA(const std::size_t e) {
                         const std::int64_t i = static_cast<std::int64_t>(e), q = i / piece, k = i % piece;
                         std::int64_t cut[GradientWords::words];
                         GradientWords::cut(g(e), cut);
                         std::int64_t* at = &w((q * slot + offset + k) * GradientWords::words);
                         for (int j = 0; j < GradientWords::words; ++j) at[j] += cut[j];
                       });
}

inline void add_words(const View1<std::int64_t>& sum, const View1<std::int64_t>& words) {
  const auto d = sum;
  const auto s = words;
  Kokkos::parallel_for("fsdpp::exact_add_words", Kokkos::RangePolicy<ExecSpace>(0, sum.extent(0)),
                       KOKKOS_LAMBDA(const std::size_t i) { d(i) += s(i); });
}

// The summed words of every shard element, as the mean over `units` in f32.
inline void words_to_mean(const View1<float>& out, const View1<std::int64_t>& words, double units) {
  const auto o = out;
  const auto w = words;
  Kokkos::parallel_for("fsdpp::exact_words_to_mean", Kokkos::RangePolicy<ExecSpace>(0, out.extent(0)),
                       KOKKOS_LAMBDA(const std::size_t i) { o(i) = GradientWords::mean(&w(i * GradientWords::words), units); });
}

}  // namespace fsdpp
