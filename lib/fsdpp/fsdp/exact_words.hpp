#pragma once
// Reproducible mode's kernels on a group's fixed-point gradient words (tensor/fixed_point.hpp), for
// fully_shard's exact reduction: cutting whole gradients into slot-ordered words, summing words, and the mean
// of summed words back in f32.
#include "fsdpp/tensor/fixed_point.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp::fsdp_detail {

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

}  // namespace fsdpp::fsdp_detail
