#include "fsdpp/fsdp/buffer_pool.hpp"

#include <algorithm>
#include <utility>

namespace fsdpp {

namespace {
// Kokkos sizes every View allocation in whole 8-byte words; blocks are sized the same way, so that what the
// pool reserves is exactly what Kokkos (and MemoryAccounting) counts.
constexpr std::int64_t kWord = 8;
}  // namespace

std::int64_t PoolRule::take(std::int64_t bytes, bool& reused) {
  live_ += bytes;
  peak_live_ = std::max(peak_live_, live_);
  const std::int64_t words = (bytes + kWord - 1) / kWord * kWord;
  auto it = free_.lower_bound(words);  // exact size first, else the smallest larger block
  reused = it != free_.end() && it->first <= 2 * words;
  if (reused) {
    const std::int64_t size = it->first;
    if (--it->second == 0) free_.erase(it);
    return size;
  }
  reserved_ += words;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  ++allocations_;
  return words;
}

void PoolRule::give_back(std::int64_t block_bytes, std::int64_t requested_bytes) {
  live_ -= requested_bytes;
  ++free_[block_bytes];
}

void PoolRule::clear() {
  for (const auto& [bytes, count] : free_) reserved_ -= bytes * count;
  free_.clear();
}

PoolBlock BufferPool::take(std::int64_t bytes, const std::string& label) {
  bool reused = false;
  const std::int64_t size = rule_.take(bytes, reused);
  PoolBlock block;
  if (reused && !dry_) {
    auto& cached = free_.at(size);
    block = std::move(cached.back());
    cached.pop_back();
    if (cached.empty()) free_.erase(size);
  }
  block.bytes = size;
  block.requested = bytes;
  if (!reused && !dry_)
    block.storage = decltype(block.storage)(Kokkos::view_alloc(Kokkos::WithoutInitializing, label),
                                            static_cast<std::size_t>(size));
  return block;
}

void BufferPool::give_back(PoolBlock block) {
  if (!block.bytes) return;
  rule_.give_back(block.bytes, block.requested);
  if (!dry_) free_[block.bytes].push_back(std::move(block));
}

void BufferPool::clear() {
  rule_.clear();
  free_.clear();  // the last handles: Kokkos frees the storage
}

}  // namespace fsdpp
