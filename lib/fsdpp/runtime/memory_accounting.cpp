#include "fsdpp/runtime/memory_accounting.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace fsdpp {
namespace {

// The compute memory space (tensor/types.hpp's MemSpace, named here because runtime/ sits below tensor/).
using ComputeSpace = Kokkos::DefaultExecutionSpace::memory_space;

struct Allocation {
  std::size_t space = 0;
  std::int64_t bytes = 0;
};

// Allocations come from the compute thread and from background checkpoint writers, so the state is locked.
// Views are allocated a few dozen times per step, far too rarely for the lock to matter.
struct AccountingState {
  std::mutex mutex;
  bool installed = false;
  std::vector<SpaceUsage> spaces;
  std::unordered_map<const void*, Allocation> live;
  Kokkos_Profiling_allocateDataFunction chained_allocate = nullptr;
  Kokkos_Profiling_deallocateDataFunction chained_deallocate = nullptr;

  std::size_t space_index(const char* name) {
    for (std::size_t i = 0; i < spaces.size(); ++i)
      if (spaces[i].space == name) return i;
    spaces.push_back(SpaceUsage{name});
    return spaces.size() - 1;
  }
};

AccountingState& accounting_state() {
  static AccountingState s;
  return s;
}

void on_allocate(Kokkos::Profiling::SpaceHandle handle, const char* label, const void* ptr, std::uint64_t size) {
  AccountingState& s = accounting_state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    const std::size_t i = s.space_index(handle.name);
    SpaceUsage& u = s.spaces[i];
    u.live_bytes += static_cast<std::int64_t>(size);
    u.peak_bytes = std::max(u.peak_bytes, u.live_bytes);
    ++u.allocations;
    s.live[ptr] = Allocation{i, static_cast<std::int64_t>(size)};
  }
  if (s.chained_allocate) s.chained_allocate(handle, label, ptr, size);
}

void on_deallocate(Kokkos::Profiling::SpaceHandle handle, const char* label, const void* ptr, std::uint64_t size) {
  AccountingState& s = accounting_state();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    const auto it = s.live.find(ptr);
    if (it != s.live.end()) {  // else allocated before install()
      s.spaces[it->second.space].live_bytes -= it->second.bytes;
      s.live.erase(it);
    }
  }
  if (s.chained_deallocate) s.chained_deallocate(handle, label, ptr, size);
}

}  // namespace

void MemoryAccounting::install() {
  AccountingState& s = accounting_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.installed) return;
  const auto previous = Kokkos::Tools::Experimental::get_callbacks();
  s.chained_allocate = previous.allocate_data;
  s.chained_deallocate = previous.deallocate_data;
  s.space_index(ComputeSpace::name());  // the device space is always listed first
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(on_deallocate);
  s.installed = true;
}

void MemoryAccounting::reset_peak() {
  AccountingState& s = accounting_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (SpaceUsage& u : s.spaces) u.peak_bytes = u.live_at_reset = u.live_bytes;
}

SpaceUsage MemoryAccounting::device() {
  AccountingState& s = accounting_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.spaces.empty() ? SpaceUsage{ComputeSpace::name()} : s.spaces.front();
}

}  // namespace fsdpp
