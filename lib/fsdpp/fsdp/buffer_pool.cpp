#include "fsdpp/fsdp/buffer_pool.hpp"

#include <algorithm>
#include <utility>

namespace fsdpp {

bool PoolRule::take(std::int64_t bytes) {
  live_ += bytes;
  peak_live_ = std::max(peak_live_, live_);
  const auto it = free_.find(bytes);
  if (it != free_.end() && it->second > 0) {
    if (--it->second == 0) free_.erase(it);
    return true;
  }
  reserved_ += bytes;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  ++allocations_;
  return false;
}

void PoolRule::give_back(std::int64_t bytes) {
  live_ -= bytes;
  ++free_[bytes];
}

void PoolRule::clear() {
  for (const auto& [bytes, count] : free_) reserved_ -= bytes * count;
  free_.clear();
}

PoolBlock BufferPool::take(std::int64_t bytes, const std::string& label) {
  if (rule_.take(bytes)) {
    auto& cached = free_.at(bytes);
    PoolBlock block = std::move(cached.back());
    cached.pop_back();
    if (cached.empty()) free_.erase(bytes);
    return block;
  }
  PoolBlock block;
  block.bytes = bytes;
  block.storage = decltype(block.storage)(Kokkos::view_alloc(Kokkos::WithoutInitializing, label),
                                          static_cast<std::size_t>(bytes));
  return block;
}

void BufferPool::give_back(PoolBlock block) {
  if (!block.bytes) return;
  rule_.give_back(block.bytes);
  free_[block.bytes].push_back(std::move(block));
}

void BufferPool::clear() {
  rule_.clear();
  free_.clear();  // the last handles: Kokkos frees the storage
}

}  // namespace fsdpp
