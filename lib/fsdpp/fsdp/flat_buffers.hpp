#pragma once
// The copy-in and copy-out of FSDP's flat collective buffers (docs/fsdp2-semantics.md §1.3-1.4). A group's flat
// buffer has one slot per rank; slot q holds piece q (the padded chunk q) of every parameter, in group order.
// Element types may differ between the buffer (param_dtype / reduce_dtype) and the f32 tensors.
#include "fsdpp/tensor/bf16.hpp"
#include "fsdpp/tensor/piece_batch.hpp"
#include "fsdpp/tensor/types.hpp"

#include <type_traits>
#include <vector>

namespace fsdpp::fsdp_detail {

// dst[i] = src[i] (converted), or dst[i] += src[i] with `accumulate` (arithmetic destinations only).
template <class To, class From>
void copy_convert(const View1<To>& dst, const View1<From>& src, bool accumulate = false) {
  const auto d = dst;
  const auto s = src;
  if constexpr (std::is_arithmetic_v<To>) {
    if (accumulate) {
      Kokkos::parallel_for("fsdpp::fsdp_accumulate", Kokkos::RangePolicy<ExecSpace>(0, dst.extent(0)),
                           KOKKOS_LAMBDA(const std::size_t i) { d(i) += convert<To>(s(i)); });
      return;
    }
  }
  if (!accumulate)
    Kokkos::parallel_for("fsdpp::fsdp_copy_convert", Kokkos::RangePolicy<ExecSpace>(0, dst.extent(0)),
                         KOKKOS_LAMBDA(const std::size_t i) { d(i) = convert<To>(s(i)); });
}

template <class T> View1<T> slice(const View1<T>& v, std::int64_t begin, std::int64_t count) {
  return Kokkos::subview(v, std::make_pair(static_cast<std::size_t>(begin), static_cast<std::size_t>(begin + count)));
}

// The layout of one group: each parameter's padded piece size and its offset inside a slot.
struct FlatLayout {
  std::vector<std::int64_t> piece;   // chunk_rows * row_size of each parameter
  std::vector<std::int64_t> offset;  // of each parameter inside a slot
  std::int64_t slot = 0;             // elements per slot (sum of pieces)
};

// Slot `q` of `flat` <- the pieces (one per parameter).
template <class T>
void pack_slot(PieceBatch<T, float>& batch, const View1<T>& flat, int q, const FlatLayout& layout,
               const std::vector<View1<float>>& pieces) {
  for (std::size_t i = 0; i < pieces.size(); ++i)
    batch.add(flat.data() + q * layout.slot + layout.offset[i], pieces[i].data(), layout.piece[i]);
  batch.run();
}

// Every slot of `flat` <- piece q of each whole (padded) tensor: the reduce-scatter copy-in.
template <class T>
void pack_all_slots(PieceBatch<T, float>& batch, const View1<T>& flat, int slots, const FlatLayout& layout,
                    const std::vector<View1<float>>& whole) {
  for (std::size_t i = 0; i < whole.size(); ++i)
    for (int q = 0; q < slots; ++q)
      batch.add(flat.data() + q * layout.slot + layout.offset[i], whole[i].data() + q * layout.piece[i], layout.piece[i]);
  batch.run();
}

// Each whole (padded) tensor <- piece q from every slot q of `flat`: the all-gather copy-out.
template <class T>
void unpack_all_slots(PieceBatch<float, T>& batch, const std::vector<View1<float>>& whole, int slots,
                      const FlatLayout& layout, const View1<T>& flat) {
  for (std::size_t i = 0; i < whole.size(); ++i)
    for (int q = 0; q < slots; ++q)
      batch.add(whole[i].data() + q * layout.piece[i], flat.data() + q * layout.slot + layout.offset[i], layout.piece[i]);
  batch.run();
}

}  // namespace fsdpp::fsdp_detail
