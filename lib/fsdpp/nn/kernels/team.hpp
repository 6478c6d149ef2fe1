#pragma once
// The portable (GPU-shaped) kernel path and its building blocks.
//
// Every row kernel has two implementations behind one entry point:
//  - tuned: one work item per row with a serial inner loop (detail.hpp), what a CPU runs fastest;
//  - portable: one Kokkos team per row, the team's threads over the columns (adjacent threads read adjacent
//    columns, so a GPU warp coalesces), reductions through team scratch memory.
// portable() picks one. Device builds always run the portable kernels. Host builds run the tuned ones unless
// the environment says FSDPP_KERNELS=portable, read once, at the first kernel call; that is how CI runs on a
// CPU exactly the kernels a GPU build runs (ctest unit_portable_np1, tests/cli/portable_parity.sh).
//
// Determinism. The portable reductions do not depend on the launch (team size, backend, thread count):
//  - team_sum / team_max split a row of n values into kSlots interleaved slots (slot l sums columns l, l+kSlots,
//    ...), whichever thread runs a slot, then add the slots up in a fixed binary tree. So a Serial run (team
//    size 1) and an OpenMP or CUDA run (team size 2..1024) give bitwise the same row sums.
//  - column_sum (layernorm/rmsnorm dweight, dbias, linear dbias) sums fixed chunks of kRowChunk rows in row
//    order into a scratch buffer, then sums the chunks in order: no atomics, the same bits on every launch.
// The elementwise kernels (gelu, swiglu) have a portable path too: one element per work item and the library exp
// (the tuned path blocks elements and uses detail::exp_fast). residual and rope are the same code on both paths.
// The portable path does not reproduce the tuned path's bits (different summation orders, the library exp
// instead of detail::exp_fast); the tests hold it to 1e-6 relative of the tuned path.
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fsdpp::kernels {

namespace detail {
// -1: not read yet; 0: tuned; 1: portable.
inline int& portable_state() {
  static int state = -1;
  return state;
}
}  // namespace detail

// True when kernels run their portable (team) implementations. Throws nothing: an unknown FSDPP_KERNELS value
// is reported once on stderr and the tuned path is kept.
inline bool portable() {
#if defined(FSDPP_DEVICE_BUILD)
  return true;
#else
  int& state = detail::portable_state();
  if (state < 0) {
    const char* env = std::getenv("FSDPP_KERNELS");
    state = env != nullptr && std::strcmp(env, "portable") == 0 ? 1 : 0;
    if (env != nullptr && state == 0 && std::strcmp(env, "tuned") != 0 && env[0] != '\0')
      std::fprintf(stderr, "fsdpp: FSDPP_KERNELS=%s is neither 'portable' nor 'tuned'; using the tuned kernels\n",
                   env);
  }
  return state == 1;
#endif
}

// Tests and the kernel benchmark switch paths in one process. No effect on device builds.
inline void set_portable(bool on) { detail::portable_state() = on ? 1 : 0; }

// Restores the previous path when it goes out of scope.
class ScopedKernelPath {
 public:
  explicit ScopedKernelPath(bool portable_on) : saved_(portable()) { set_portable(portable_on); }
  ~ScopedKernelPath() { set_portable(saved_); }
  ScopedKernelPath(const ScopedKernelPath&) = delete;
  ScopedKernelPath& operator=(const ScopedKernelPath&) = delete;

 private:
  bool saved_;
};

namespace team {

// Slots of a row reduction. A power of two; the same on every backend so that results are bitwise equal.
inline constexpr int kSlots = 256;
// Rows per chunk of a column reduction's first stage.
inline constexpr int kRowChunk = 64;

using Member = Kokkos::TeamPolicy<ExecSpace>::member_type;
template <class T> using Scratch = Kokkos::View<T*, ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;

// Team size: FSDPP_TEAM_SIZE when set (the OpenMP CI step forces teams above 1 thread), else Kokkos's choice;
// 256 threads on a GPU (one per slot). Capped at the backend's concurrency (Serial: 1).
inline int requested_team_size() {
  static const int size = [] {
    const char* env = std::getenv("FSDPP_TEAM_SIZE");
    return env != nullptr ? std::atoi(env) : 0;
  }();
  return size;
}

// One team per row, with `slot_values` values of type T of team scratch for the reductions.
template <class T> Kokkos::TeamPolicy<ExecSpace> row_policy(std::int64_t rows, int slot_values = kSlots) {
  const std::size_t bytes = Scratch<T>::shmem_size(slot_values);
  int size = requested_team_size();
#if defined(FSDPP_DEVICE_BUILD)
  if (size <= 0) size = kSlots;
#endif
  if (size > 0) {
    size = kmin(size, ExecSpace().concurrency());
    return Kokkos::TeamPolicy<ExecSpace>(rows, size).set_scratch_size(0, Kokkos::PerTeam(bytes));
  }
  return Kokkos::TeamPolicy<ExecSpace>(rows, Kokkos::AUTO).set_scratch_size(0, Kokkos::PerTeam(bytes));
}

// Adds the kSlots values of s into s[0] in a fixed binary tree; every thread of the team returns s[0].
template <class T> KOKKOS_INLINE_FUNCTION T tree_sum(const Member& team, const Scratch<T>& s) {
  for (int half = kSlots / 2; half > 0; half /= 2) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, half), [&](const int l) { s(l) += s(l + half); });
    team.team_barrier();
  }
  const T total = s(0);
  team.team_barrier();  // the next reduction may overwrite s(0)
  return total;
}

// sum_{i < n} f(i), slot l summing i = l, l + kSlots, ... in order; then tree_sum. Launch-independent bits.
template <class T, class F>
KOKKOS_INLINE_FUNCTION T team_sum(const Member& team, const Scratch<T>& s, int n, const F& f) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kSlots), [&](const int l) {
    T acc = T(0);
    for (int i = l; i < n; i += kSlots) acc += f(i);
    s(l) = acc;
  });
  team.team_barrier();
  return tree_sum(team, s);
}

// max_{i < n} x[i], n >= 1 (exact whatever the order).
template <class T> KOKKOS_INLINE_FUNCTION T team_max(const Member& team, const Scratch<T>& s, int n, const T* x) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kSlots), [&](const int l) {
    T m = x[0];
    for (int i = l; i < n; i += kSlots) m = kmax(m, x[i]);
    s(l) = m;
  });
  team.team_barrier();
  for (int half = kSlots / 2; half > 0; half /= 2) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, half), [&](const int l) { s(l) = kmax(s(l), s(l + half)); });
    team.team_barrier();
  }
  const T m = s(0);
  team.team_barrier();
  return m;
}

// Online max and sum of exp (Milakov & Gimelshein 2018) over x[0..n), n >= 1, in one pass: slot l keeps its own
// running (max, sum of exp(x - max)), rescaling its sum when the max grows; the slots merge in a fixed tree.
// s holds 2 * kSlots values. On return every thread has the row's max and sum(exp(x - max)).
template <class T>
KOKKOS_INLINE_FUNCTION void team_online_softmax_stats(const Member& team, const Scratch<T>& s, int n, const T* x,
                                                      T& row_max, T& row_sum) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kSlots), [&](const int l) {
    // An empty slot (l >= n) has sum 0 and max x[0] <= the row max, so merging it adds exactly 0.
    T m = l < n ? x[l] : x[0], acc = T(0);
    for (int i = l; i < n; i += kSlots) {
      const T xi = x[i];
      if (xi > m) {
        acc = acc * kmath::exp(m - xi) + T(1);
        m = xi;
      } else {
        acc += kmath::exp(xi - m);
      }
    }
    s(l) = m;
    s(kSlots + l) = acc;
  });
  team.team_barrier();
  for (int half = kSlots / 2; half > 0; half /= 2) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, half), [&](const int l) {
      const T m1 = s(l), m2 = s(l + half), m = kmax(m1, m2);
      s(kSlots + l) = s(kSlots + l) * kmath::exp(m1 - m) + s(kSlots + l + half) * kmath::exp(m2 - m);
      s(l) = m;
    });
    team.team_barrier();
  }
  row_max = s(0);
  row_sum = s(kSlots);
  team.team_barrier();
}

// The first-stage scratch of column_sum, grown to the largest size asked for and kept until Kokkos::finalize
// (no allocation per step once the first step has run).
template <class T> View1<T> column_scratch(std::size_t n) {
  static View1<T> buffer;
  static bool hooked = false;
  if (!hooked) {
    Kokkos::push_finalize_hook([] { buffer = View1<T>(); });
    hooked = true;
  }
  if (buffer.extent(0) < n) {
    buffer = View1<T>();
    buffer = uninitialized<T>("fsdpp::column_sum_scratch", n);
  }
  return buffer;
}

// out[c] += sum_{n < N} f(n, c), for c < C: chunks of kRowChunk rows summed in row order (parallel over
// chunk x column, adjacent work items on adjacent columns), then the chunks summed in order per column.
// Every caller shares the two launch labels (fsdpp::column_sum_*); in a profile they follow their row kernel.
template <class T, class F> void column_sum(const View1<T>& out, int N, int C, const F& f) {
  const int chunks = (N + kRowChunk - 1) / kRowChunk;
  if (C == 0) return;
  View1<T> part = column_scratch<T>(static_cast<std::size_t>(kmax(chunks, 1)) * C);
  Kokkos::parallel_for(
      "fsdpp::column_sum_chunks", Kokkos::RangePolicy<ExecSpace>(0, std::int64_t(chunks) * C), KOKKOS_LAMBDA(const std::int64_t i) {
        const int k = static_cast<int>(i / C), c = static_cast<int>(i % C);
        const int n1 = kmin(N, (k + 1) * kRowChunk);
        T acc = T(0);
        for (int n = k * kRowChunk; n < n1; ++n) acc += f(n, c);
        part(i) = acc;
      });
  Kokkos::parallel_for(
      "fsdpp::column_sum_total", Kokkos::RangePolicy<ExecSpace>(0, C), KOKKOS_LAMBDA(const int c) {
        T acc = T(0);
        for (int k = 0; k < chunks; ++k) acc += part(std::int64_t(k) * C + c);
        out(c) += acc;
      });
}

}  // namespace team
}  // namespace fsdpp::kernels
