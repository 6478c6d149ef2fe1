#pragma once
// Allocation accounting: every Kokkos View allocation and free, counted per memory space through the Kokkos
// Tools allocate/deallocate callbacks (common to Kokkos 3.4 and 4.x). It gives the measured per-rank peak that
// `fsdpp plan` is checked against, and the memory lines of the end-of-run summary. A profiling tool loaded
// with KOKKOS_TOOLS_LIBS keeps receiving the same events: the callbacks it installed are chained.
//
//   MemoryAccounting::install();                 // once, after Kokkos::initialize (Runtime does it)
//   MemoryAccounting::reset_peak();              // the peak restarts from what is live now
//   MemoryAccounting::device().peak_bytes;       // high-water mark in the compute memory space
#include <cstdint>
#include <string>

namespace fsdpp {

struct SpaceUsage {
  std::string space;            // Kokkos' name: "Host", "Cuda", "CudaHostPinned", ...
  std::int64_t live_bytes = 0;  // allocated now
  std::int64_t peak_bytes = 0;  // the most allocated at once since install or the last reset_peak
  std::int64_t allocations = 0; // Kokkos allocations since install (tests: a training step after the first makes none)
  std::int64_t live_at_reset = 0;  // live when the peak was last reset: what earlier work in the process left
};

class MemoryAccounting {
 public:
  // Idempotent. Allocations made before it are not seen, and their frees are ignored.
  static void install();
  static void reset_peak();
  static SpaceUsage device();                // the space Views are allocated in by default (MemSpace)
};

}  // namespace fsdpp
