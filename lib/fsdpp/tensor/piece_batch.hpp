#pragma once
// Copies between many pieces of memory as one kernel (fully_shard's copy-in and copy-out, gradient zeroing).
#include "fsdpp/tensor/bf16.hpp"
#include "fsdpp/tensor/types.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace fsdpp {

// Element conversion of the copies: f32 <-> bf16 rounds as the mixed-precision casts do.
template <class To, class From> KOKKOS_INLINE_FUNCTION To convert(From x) { return static_cast<To>(x); }
template <> KOKKOS_INLINE_FUNCTION bf16 convert<bf16, float>(float x) { return bf16::from_float(x); }
template <> KOKKOS_INLINE_FUNCTION float convert<float, bf16>(bf16 x) { return x.to_float(); }

// A batch of copies between pieces, run as one kernel: FSDP's copy-in and copy-out touch every parameter in
// every slot, and one tiny kernel per piece would cost a launch each (params x ranks per collective). The
// batch is a table of chunks in device memory, each at most kPieceChunk consecutive elements of one piece: one
// team per chunk, the team's threads over its elements (a GPU warp reads and writes adjacent elements; a CPU
// team of one runs a plain contiguous loop), so large and small pieces share the threads evenly. Plain element
// copies, so the results are bitwise those of one copy per piece.
template <class To, class From> struct PieceCopy {
  To* dst = nullptr;
  const From* src = nullptr;  // unused when zeroing
  std::int64_t count = 0;     // elements of this chunk
};

// Elements per chunk: enough for a GPU team's threads to stream several each, few enough that a piece of a
// handful of rows and a whole embedding split into balanced work.
inline constexpr std::int64_t kPieceChunk = 4096;

template <class To, class From> using PieceTable = Kokkos::View<PieceCopy<To, From>*, Layout, MemSpace>;
using PieceTeam = Kokkos::TeamPolicy<ExecSpace>::member_type;

// The kernels, free functions (nvcc refuses extended lambdas in private member functions).
template <class To, class From> void run_piece_copies(const PieceTable<To, From>& table, int chunks) {
  const auto t = table;
  Kokkos::parallel_for("fsdpp::copy_pieces", Kokkos::TeamPolicy<ExecSpace>(chunks, Kokkos::AUTO),
                       KOKKOS_LAMBDA(const PieceTeam& team) {
                         const PieceCopy<To, From> c = t(team.league_rank());
                         Kokkos::parallel_for(Kokkos::TeamThreadRange(team, c.count), [&](const std::int64_t i) {
                           c.dst[i] = convert<To>(c.src[i]);
                         });
                       });
}

template <class To, class From> void run_piece_accumulates(const PieceTable<To, From>& table, int chunks) {
  const auto t = table;
  Kokkos::parallel_for("fsdpp::accumulate_pieces", Kokkos::TeamPolicy<ExecSpace>(chunks, Kokkos::AUTO),
                       KOKKOS_LAMBDA(const PieceTeam& team) {
                         const PieceCopy<To, From> c = t(team.league_rank());
                         Kokkos::parallel_for(Kokkos::TeamThreadRange(team, c.count), [&](const std::int64_t i) {
                           c.dst[i] += convert<To>(c.src[i]);
                         });
                       });
}

template <class To, class From> void run_piece_zeros(const PieceTable<To, From>& table, int chunks) {
  const auto t = table;
  Kokkos::parallel_for("fsdpp::zero_pieces", Kokkos::TeamPolicy<ExecSpace>(chunks, Kokkos::AUTO),
                       KOKKOS_LAMBDA(const PieceTeam& team) {
                         const PieceCopy<To, From> c = t(team.league_rank());
                         Kokkos::parallel_for(Kokkos::TeamThreadRange(team, c.count),
                                              [&](const std::int64_t i) { c.dst[i] = To(); });
                       });
}

enum class PieceOp { copy, accumulate, zero };

// Collects a batch on the host, then launches it. The device table is allocated at the first batch of its
// size or larger (the first step) and reused after: refilling it is a copy on the stream, ordered after the
// kernels that read the previous batch; no allocation, no fence.
template <class To, class From> class PieceBatch {
 public:
  void add(To* dst, const From* src, std::int64_t count) {
    for (std::int64_t first = 0; first < count; first += kPieceChunk)
      pending_.push_back(PieceCopy<To, From>{dst + first, src ? src + first : nullptr,
                                             std::min(kPieceChunk, count - first)});
  }
  void run(PieceOp op = PieceOp::copy) {
    const int chunks = static_cast<int>(pending_.size());
    if (chunks == 0) return;
    if (table_.extent(0) < pending_.size()) {
      table_ = PieceTable<To, From>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "fsdpp.piece_table"),
                                    pending_.size());
      host_ = Kokkos::create_mirror_view(table_);
    }
    for (std::size_t i = 0; i < pending_.size(); ++i) host_(i) = pending_[i];
    Kokkos::deep_copy(ExecSpace(), table_, host_);
    if (op == PieceOp::copy) run_piece_copies(table_, chunks);
    else if (op == PieceOp::zero) run_piece_zeros(table_, chunks);
    else if constexpr (std::is_arithmetic_v<To>) run_piece_accumulates(table_, chunks);
    pending_.clear();
  }

 private:
  std::vector<PieceCopy<To, From>> pending_;
  PieceTable<To, From> table_;
  typename PieceTable<To, From>::HostMirror host_;
};

}  // namespace fsdpp
