#include "fsdpp/comm/mpi_algorithms.hpp"

#include "fsdpp/comm/large_count.hpp"
#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace fsdpp::mpi_algorithms {
namespace {

// Reductions accumulate in at least f32: bf16 partial sums would lose a bit per ring step.
template <class T> struct accumulator { using type = T; };
template <> struct accumulator<bf16> { using type = float; };
template <class T> using acc_t = typename accumulator<T>::type;

template <class Acc, class T> inline Acc widen(T x) { return static_cast<Acc>(x); }
template <> inline float widen<float, bf16>(bf16 x) { return x.to_float(); }
template <class T, class Acc> inline T narrow(Acc x) { return static_cast<T>(x); }
template <> inline bf16 narrow<bf16, float>(float x) { return bf16::from_float(x); }

template <class T> MPI_Datatype mpi_type_of();
template <> MPI_Datatype mpi_type_of<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type_of<double>() { return MPI_DOUBLE; }
template <> MPI_Datatype mpi_type_of<bf16>() { return MPI_UINT16_T; }
template <> MPI_Datatype mpi_type_of<std::int64_t>() { return MPI_INT64_T; }

// Calls f(T{}) with the element type of an arithmetic dtype.
template <class F> void with_arithmetic_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::i64: f(std::int64_t{}); return;
    case DType::bytes: break;
  }
  throw Error("cannot reduce raw bytes: reductions need dtype f32, f64, bf16 or i64");
}

constexpr std::size_t align_up(std::size_t bytes) { return (bytes + 63) & ~std::size_t{63}; }

unsigned char* scratch_bytes(const Context& c, std::size_t bytes) {
  if (c.scratch->size() < bytes) c.scratch->resize(bytes);
  return c.scratch->data();
}

// Sum one segment of the ring: dst = in_scale * in + pre * own, then, on the last step, dst = post * dst
// stored in T. `In` is T on the first ring step (raw input travels) and the accumulator type after it.
template <class T, class In, class Dst>
void combine_segment(const In* in, const T* own, Dst* dst, std::size_t n, acc_t<T> in_scale, acc_t<T> pre,
                     acc_t<T> post, bool last) {
  using Acc = acc_t<T>;
  if (last) {
    for (std::size_t i = 0; i < n; ++i)
      dst[i] = narrow<Dst, Acc>(post * (in_scale * widen<Acc>(in[i]) + pre * widen<Acc>(own[i])));
  } else {
    for (std::size_t i = 0; i < n; ++i)
      dst[i] = narrow<Dst, Acc>(in_scale * widen<Acc>(in[i]) + pre * widen<Acc>(own[i]));
  }
}

template <class T>
void ring_reduce_scatter(const Context& c, const T* send, T* recv, std::size_t count, double pre_d, double post_d) {
  using Acc = acc_t<T>;
  const Acc pre = static_cast<Acc>(pre_d), post = static_cast<Acc>(post_d);
  const int n = c.size, r = c.rank;
  if (n == 1) {
    for (std::size_t i = 0; i < count; ++i) recv[i] = narrow<T, Acc>(post * (pre * widen<Acc>(send[i])));
    return;
  }
  if (count == 0) return;

  const std::size_t seg = std::max<std::size_t>(
      1, std::min<std::size_t>(c.segment_bytes / sizeof(Acc), std::min<std::size_t>(c.max_message_elements, INT_MAX)));
  const std::size_t acc_bytes = align_up(count * sizeof(Acc));
  const std::size_t seg_bytes = align_up(seg * std::max(sizeof(T), sizeof(Acc)));
  unsigned char* base = scratch_bytes(c, 2 * acc_bytes + 2 * seg_bytes);
  Acc* partial[2] = {reinterpret_cast<Acc*>(base), reinterpret_cast<Acc*>(base + acc_bytes)};
  unsigned char* landing[2] = {base + 2 * acc_bytes, base + 2 * acc_bytes + seg_bytes};

  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  const std::size_t nseg = (count + seg - 1) / seg;
  std::vector<MPI_Request> sends(nseg);
  int current = 0;  // partial[current] holds what this rank sends on steps after the first

  // Step s passes block (r-s-1) to the right and folds block (r-s-2) from the left into its own contribution;
  // after size-1 steps the block folded last is block r, summed over every rank.
  for (int s = 0; s < n - 1; ++s) {
    const bool first = s == 0, last = s == n - 2;
    const std::size_t send_block = static_cast<std::size_t>((r - s - 1 + 2 * n) % n);
    const std::size_t recv_block = static_cast<std::size_t>((r - s - 2 + 2 * n) % n);
    const unsigned char* out = first ? reinterpret_cast<const unsigned char*>(send + send_block * count)
                                     : reinterpret_cast<const unsigned char*>(partial[current]);
    const MPI_Datatype type = first ? mpi_type_of<T>() : mpi_type_of<Acc>();
    const std::size_t elem = first ? sizeof(T) : sizeof(Acc);
    const T* own = send + recv_block * count;
    Acc* next = partial[1 - current];

    auto seg_len = [&](std::size_t k) { return static_cast<int>(std::min(seg, count - k * seg)); };
    for (std::size_t k = 0; k < nseg; ++k)
      FSDPP_MPI_CHECK(MPI_Isend(out + k * seg * elem, seg_len(k), type, right, 0, c.comm, &sends[k]));
    MPI_Request incoming[2];
    auto post_recv = [&](std::size_t k) {
      FSDPP_MPI_CHECK(MPI_Irecv(landing[k % 2], seg_len(k), type, left, 0, c.comm, &incoming[k % 2]));
    };
    post_recv(0);
    for (std::size_t k = 0; k < nseg; ++k) {
      // Double-buffered: segment k+1 lands while segment k is added.
      if (k + 1 < nseg) post_recv(k + 1);
      FSDPP_MPI_CHECK(MPI_Wait(&incoming[k % 2], MPI_STATUS_IGNORE));
      const std::size_t off = k * seg, len = static_cast<std::size_t>(seg_len(k));
      if (first) {
        const T* in = reinterpret_cast<const T*>(landing[k % 2]);
        if (last) combine_segment<T>(in, own + off, recv + off, len, pre, pre, post, true);
        else combine_segment<T>(in, own + off, next + off, len, pre, pre, post, false);
      } else {
        const Acc* in = reinterpret_cast<const Acc*>(landing[k % 2]);
        if (last) combine_segment<T>(in, own + off, recv + off, len, Acc(1), pre, post, true);
        else combine_segment<T>(in, own + off, next + off, len, Acc(1), pre, post, false);
      }
    }
    FSDPP_MPI_CHECK(MPI_Waitall(static_cast<int>(nseg), sends.data(), MPI_STATUSES_IGNORE));
    current = 1 - current;
  }
}

}  // namespace

MPI_Datatype wire_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16: return MPI_UINT16_T;
    case DType::i64: return MPI_INT64_T;
    case DType::bytes: return MPI_BYTE;
  }
  return MPI_BYTE;
}

void all_gather_native(const Context& c, const void* send, void* recv, std::size_t count, DType dtype) {
  if (count == 0) return;
  const std::size_t elem = dtype_size(dtype);
  const MPI_Datatype type = wire_type(dtype);
  auto* out = static_cast<unsigned char*>(recv);
  const bool in_place = send == out + static_cast<std::size_t>(c.rank) * count * elem;
  const void* source = in_place ? MPI_IN_PLACE : send;
  if (count <= c.max_message_elements && count <= static_cast<std::size_t>(INT_MAX)) {
    FSDPP_MPI_CHECK(MPI_Allgather(source, static_cast<int>(count), type, recv, static_cast<int>(count), type, c.comm));
    return;
  }
  // Over the count limit: gather piece by piece. Each rank's piece lands inside its own block, so the
  // receive type is `len` elements with an extent of a whole block (count elements).
  PiecePlan(count, c.max_message_elements).for_each([&](Piece p) {
    MPI_Datatype piece = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
    FSDPP_MPI_CHECK(MPI_Type_contiguous(p.count, type, &piece));
    FSDPP_MPI_CHECK(MPI_Type_create_resized(piece, 0, static_cast<MPI_Aint>(count * elem), &strided));
    FSDPP_MPI_CHECK(MPI_Type_commit(&strided));
    const void* from = in_place ? MPI_IN_PLACE : static_cast<const unsigned char*>(send) + p.offset * elem;
    FSDPP_MPI_CHECK(MPI_Allgather(from, p.count, type, out + p.offset * elem, 1, strided, c.comm));
    MPI_Type_free(&strided);
    MPI_Type_free(&piece);
  });
}

void all_gather_ring(const Context& c, const void* send, void* recv, std::size_t count, DType dtype) {
  if (count == 0) return;
  const std::size_t elem = dtype_size(dtype), block = count * elem;
  const MPI_Datatype type = wire_type(dtype);
  auto* out = static_cast<unsigned char*>(recv);
  const int n = c.size, r = c.rank;
  if (send != out + static_cast<std::size_t>(r) * block) std::memcpy(out + static_cast<std::size_t>(r) * block, send, block);
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    const std::size_t send_block = static_cast<std::size_t>((r - s + n) % n);
    const std::size_t recv_block = static_cast<std::size_t>((r - s - 1 + n) % n);
    PiecePlan(count, c.max_message_elements).for_each([&](Piece p) {
      FSDPP_MPI_CHECK(MPI_Sendrecv(out + send_block * block + p.offset * elem, p.count, type, right, 0,
                                   out + recv_block * block + p.offset * elem, p.count, type, left, 0, c.comm,
                                   MPI_STATUS_IGNORE));
    });
  }
}

void reduce_scatter_ring(const Context& c, const void* send, void* recv, std::size_t count, DType dtype,
                         double pre, double post) {
  with_arithmetic_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    ring_reduce_scatter<T>(c, static_cast<const T*>(send), static_cast<T*>(recv), count, pre, post);
  });
}

void reduce_scatter_native(const Context& c, const void* send, void* recv, std::size_t count, DType dtype,
                           double pre, double post) {
  // MPI_Reduce_scatter_block takes one int count per rank and no bf16; beyond those, the ring does the work.
  if (count > c.max_message_elements || count > static_cast<std::size_t>(INT_MAX) || dtype == DType::bf16) {
    reduce_scatter_ring(c, send, recv, count, dtype, pre, post);
    return;
  }
  with_arithmetic_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<T>) {  // bf16 went to the ring above
      FSDPP_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), mpi_type_of<T>(), MPI_SUM, c.comm));
      const T scale = static_cast<T>(pre * post);
      if (scale != T(1))
        for (std::size_t i = 0; i < count; ++i) static_cast<T*>(recv)[i] *= scale;
    }
  });
}

void all_reduce_native(const Context& c, void* buf, std::size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  with_arithmetic_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    using Acc = acc_t<T>;
    T* data = static_cast<T*>(buf);
    Acc* work = reinterpret_cast<Acc*>(data);
    if constexpr (!std::is_same_v<T, Acc>) {  // bf16: reduce a f32 copy
      work = reinterpret_cast<Acc*>(scratch_bytes(c, count * sizeof(Acc)));
      for (std::size_t i = 0; i < count; ++i) work[i] = widen<Acc>(data[i]);
    }
    const MPI_Op mpi_op = op == ReduceOp::max ? MPI_MAX : MPI_SUM;
    PiecePlan(count, c.max_message_elements).for_each([&](Piece p) {
      FSDPP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, work + p.offset, p.count, mpi_type_of<Acc>(), mpi_op, c.comm));
    });
    const Acc scale = op == ReduceOp::avg ? Acc(1) / static_cast<Acc>(c.size) : Acc(1);
    if constexpr (!std::is_same_v<T, Acc>) {
      for (std::size_t i = 0; i < count; ++i) data[i] = narrow<T, Acc>(work[i] * scale);
    } else if (scale != Acc(1)) {
      for (std::size_t i = 0; i < count; ++i) data[i] *= scale;
    }
  });
}

void all_reduce_ring(const Context& c, void* buf, std::size_t count, DType dtype, ReduceOp op) {
  const std::size_t block = count / static_cast<std::size_t>(c.size);
  if (op == ReduceOp::max || c.size == 1 || block == 0) {
    all_reduce_native(c, buf, count, dtype, op);
    return;
  }
  // In place is safe: the ring reads block `rank` only on its last step, element by element as it writes it.
  auto* bytes = static_cast<unsigned char*>(buf);
  const std::size_t elem = dtype_size(dtype);
  unsigned char* mine = bytes + static_cast<std::size_t>(c.rank) * block * elem;
  const double post = op == ReduceOp::avg ? 1.0 / c.size : 1.0;
  reduce_scatter_ring(c, buf, mine, block, dtype, 1.0, post);
  all_gather_native(c, mine, buf, block, dtype);
  const std::size_t tail = count - block * static_cast<std::size_t>(c.size);
  if (tail) all_reduce_native(c, bytes + (count - tail) * elem, tail, dtype, op);
}

void broadcast_native(const Context& c, void* buf, std::size_t count, DType dtype, int root) {
  const std::size_t elem = dtype_size(dtype);
  PiecePlan(count, c.max_message_elements).for_each([&](Piece p) {
    FSDPP_MPI_CHECK(MPI_Bcast(static_cast<unsigned char*>(buf) + p.offset * elem, p.count, wire_type(dtype), root, c.comm));
  });
}

}  // namespace fsdpp::mpi_algorithms
