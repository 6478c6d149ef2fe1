#pragma once
// fully_shard's caching pool for its transient buffers (all-gather and reduce-scatter buffers, whole parameters
// and gradients, staging): like PyTorch's caching allocator, a buffer fully_shard frees goes back to the pool,
// and the next request of exactly the same size takes it again (the most recently freed first). After the first
// training step every request finds its block, so a step allocates nothing (no cudaMalloc, no cudaFree, which
// synchronizes the device); memory returns to Kokkos only when the pool is cleared (empty_fsdp_cache, or when
// the model goes).
//
// Exact sizes keep the rule deterministic and blind to addresses: the same sequence of requests always
// reserves the same bytes. PoolRule is that rule on sizes alone; BufferPool applies it with storage, and
// `fsdpp plan` applies it to the memory events of its dry step (train/memory_plan.cpp), so it predicts what
// the pool reserves, which is what Kokkos (and MemoryAccounting) sees.
//   live:     bytes handed out now (torch.cuda.memory_allocated)
//   reserved: live plus the cached free blocks (torch.cuda.memory_reserved)
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdpp {

class PoolRule {
 public:
  // A request of `bytes`: true when a cached free block of that size serves it, false when the pool allocates.
  bool take(std::int64_t bytes);
  void give_back(std::int64_t bytes);  // a block of `bytes` is free again (it stays reserved)
  void clear();                        // every free block goes back to Kokkos
  std::int64_t live_bytes() const { return live_; }
  std::int64_t reserved_bytes() const { return reserved_; }
  std::int64_t peak_live_bytes() const { return peak_live_; }
  std::int64_t peak_reserved_bytes() const { return peak_reserved_; }
  std::int64_t allocations() const { return allocations_; }  // requests no free block served, since creation

 private:
  std::map<std::int64_t, std::int64_t> free_;  // size -> free blocks of that size
  std::int64_t live_ = 0, reserved_ = 0, peak_live_ = 0, peak_reserved_ = 0, allocations_ = 0;
};

// A block of the pool: untyped device storage of `bytes`, viewed as T by its user.
struct PoolBlock {
  Kokkos::View<unsigned char*, Layout, MemSpace> storage;
  std::int64_t bytes = 0;
};

class BufferPool {
 public:
  // A block of exactly `bytes`, cached or new (then allocated under `label`, uninitialized).
  PoolBlock take(std::int64_t bytes, const std::string& label);
  void give_back(PoolBlock block);
  void clear();  // frees every cached block; blocks handed out stay valid and return to the pool as usual
  const PoolRule& rule() const { return rule_; }

 private:
  PoolRule rule_;
  std::map<std::int64_t, std::vector<PoolBlock>> free_;  // size -> free blocks, the most recently freed last
};

}  // namespace fsdpp
