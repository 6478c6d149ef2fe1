#include "fsdpp/observe/collective_faults.hpp"

#include "fsdpp/runtime/error.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace fsdpp {
namespace {

std::atomic<bool> g_collective_fault_armed{false};
std::mutex g_collective_fault_mutex;
CollectiveSkip g_skip;

}  // namespace

CollectiveSkip parse_collective_skip(const std::string& text) {
  CollectiveSkip skip;
  char dimension[64] = {0};
  unsigned long long seq = 0;
  int used = 0;
  const bool ok = std::sscanf(text.c_str(), "%d:%63[A-Za-z0-9_]:%llu%n", &skip.rank, dimension, &seq, &used) == 3 &&
                  used == static_cast<int>(text.size()) && skip.rank >= 0 && seq >= 1;
  FSDPP_REQUIRE(ok, "FSDPP_TEST_SKIP_COLLECTIVE='{}': expected <rank>:<dimension>:<sequence number>, e.g. 1:dp_shard:12",
                text);
  skip.dimension = dimension;
  skip.seq = seq;
  return skip;
}

void arm_collective_skip(const CollectiveSkip& skip) {
  std::lock_guard<std::mutex> lock(g_collective_fault_mutex);
  g_skip = skip;
  g_collective_fault_armed = true;
}

bool collective_fault_armed() { return g_collective_fault_armed.load(std::memory_order_relaxed); }

bool take_collective_skip(const std::string& dimension, std::uint64_t seq) {
  std::lock_guard<std::mutex> lock(g_collective_fault_mutex);
  if (!g_collective_fault_armed || g_skip.dimension != dimension || g_skip.seq != seq) return false;
  g_collective_fault_armed = false;
  return true;
}

}  // namespace fsdpp
