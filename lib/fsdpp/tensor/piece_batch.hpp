#pragma once
// Copies between many pieces of memory as one kernel (fully_shard's copy-in and copy-out, gradient zeroing).
#include "fsdpp/tensor/bf16.hpp"
#include "fsdpp/tensor/types.hpp"

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
// batch is a table of (destination, source, first element) in device memory: the kernel runs over the
// batch's elements, and element e finds its piece by binary search over the first elements (a handful of
// steps), so large and small pieces share the threads evenly. Plain element copies, so the results are
// bitwise those of one copy per piece.
template <class To, class From> struct PieceCopy {
  To* dst = nullptr;
  const From* src = nullptr;  // unused when zeroing
  std::int64_t begin = 0;     // of this piece in the batch; the last entry's is the batch's size
};

template <class To, class From> using PieceTable = Kokkos::View<PieceCopy<To, From>*, Layout, MemSpace>;

// Index of the piece holding element e: the last entry with begin <= e (entries 0..n-1; n is the end).
template <class To, class From>
KOKKOS_INLINE_FUNCTION int find_piece(const PieceTable<To, From>& t, int n, std::int64_t e) {
  int lo = 0, hi = n;  // t(lo).begin <= e < t(hi).begin
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (t(mid).begin <= e) lo = mid;
    else hi = mid;
  }
  return lo;
}

// The kernels, free functions (nvcc refuses extended lambdas in private member functions).
template <class To, class From> void run_piece_copies(const PieceTable<To, From>& table, int n, std::int64_t total) {
  const auto t = table;
  Kokkos::parallel_for("fsdpp::copy_pieces", Kokkos::RangePolicy<ExecSpace>(0, total),
                       KOKKOS_LAMBDA(const std::int64_t e) {
                         const PieceCopy<To, From> c = t(find_piece(t, n, e));
                         c.dst[e - c.begin] = convert<To>(c.src[e - c.begin]);
                       });
}

template <class To, class From> void run_piece_accumulates(const PieceTable<To, From>& table, int n, std::int64_t total) {
  const auto t = table;
  Kokkos::parallel_for("fsdpp::accumulate_pieces", Kokkos::RangePolicy<ExecSpace>(0, total),
                       KOKKOS_LAMBDA(const std::int64_t e) {
                         const PieceCopy<To, From> c = t(find_piece(t, n, e));
                         c.dst[e - c.begin] += convert<To>(c.src[e - c.begin]);
                       });
}

template <class To, class From> void run_piece_zeros(const PieceTable<To, From>& table, int n, std::int64_t total) {
  const auto t = table;
  Kokkos::parallel_for("fsdpp::zero_pieces", Kokkos::RangePolicy<ExecSpace>(0, total),
                       KOKKOS_LAMBDA(const std::int64_t e) {
                         const PieceCopy<To, From> c = t(find_piece(t, n, e));
                         c.dst[e - c.begin] = To();
                       });
}

enum class PieceOp { copy, accumulate, zero };

// Collects a batch on the host, then launches it. The device table is allocated at the first batch of its
// size or larger (the first step) and reused after: refilling it is a copy on the stream, ordered after the
// kernels that read the previous batch; no allocation, no fence.
template <class To, class From> class PieceBatch {
 public:
  void add(To* dst, const From* src, std::int64_t count) {
    if (count <= 0) return;
    pending_.push_back(PieceCopy<To, From>{dst, src, total_});
    total_ += count;
  }
  void run(PieceOp op = PieceOp::copy) {
    const int n = static_cast<int>(pending_.size());
    if (n == 0) return;
    pending_.push_back(PieceCopy<To, From>{nullptr, nullptr, total_});  // the end of the last piece
    if (table_.extent(0) < pending_.size()) {
      table_ = PieceTable<To, From>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "fsdpp.piece_table"),
                                    pending_.size());
      host_ = Kokkos::create_mirror_view(table_);
    }
    for (std::size_t i = 0; i < pending_.size(); ++i) host_(i) = pending_[i];
    Kokkos::deep_copy(ExecSpace(), table_, host_);
    if (op == PieceOp::copy) run_piece_copies(table_, n, total_);
    else if (op == PieceOp::zero) run_piece_zeros(table_, n, total_);
    else if constexpr (std::is_arithmetic_v<To>) run_piece_accumulates(table_, n, total_);
    pending_.clear();
    total_ = 0;
  }

 private:
  std::vector<PieceCopy<To, From>> pending_;
  std::int64_t total_ = 0;
  PieceTable<To, From> table_;
  typename PieceTable<To, From>::HostMirror host_;
};

}  // namespace fsdpp
