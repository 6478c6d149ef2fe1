#pragma once
// fully_shard's caching pool for its transient buffers (all-gather and reduce-scatter buffers, whole parameters
// and gradients, staging): like PyTorch's caching allocator, a buffer fully_shard frees goes back to the pool,
// and a later request takes it again. After the first training step every request finds a block, so a step
// allocates nothing (no cudaMalloc, no cudaFree, which synchronizes the device); memory returns to Kokkos only
// when the pool is cleared (empty_fsdp_cache, or when the model goes).
//
// The rule (PoolRule), on sizes alone: a request of n bytes (rounded up to whole 8-byte words, as Kokkos sizes
// allocations) takes a free block of exactly that size if there is one (the most recently freed), else the
// smallest free block of at most twice it (blocks are never split, so a larger one would waste more than it
// saves), else a new block of that size. It is deterministic and blind to
// addresses: the same sequence of requests always reserves the same bytes. Groups that run dry (`fsdpp plan`)
// apply the same rule without storage, so the plan predicts what the pool reserves, which is what Kokkos (and
// MemoryAccounting) sees.
//   live:     bytes requested and not yet freed (torch.cuda.memory_allocated)
//   reserved: every block the pool holds, in use or free (torch.cuda.memory_reserved)
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace fsdpp {

class PoolRule {
 public:
  // A request of `bytes`: the size of the block that serves it; `reused` is false when that block is new.
  std::int64_t take(std::int64_t bytes, bool& reused);
  void give_back(std::int64_t block_bytes, std::int64_t requested_bytes);  // free again, still reserved
  void clear();  // every free block goes back to Kokkos
  std::int64_t live_bytes() const { return live_; }
  std::int64_t reserved_bytes() const { return reserved_; }
  std::int64_t peak_live_bytes() const { return peak_live_; }
  std::int64_t peak_reserved_bytes() const { return peak_reserved_; }
  std::int64_t allocations() const { return allocations_; }  // new blocks since creation

 private:
  std::map<std::int64_t, std::int64_t> free_;  // block size -> free blocks of that size
  std::int64_t live_ = 0, reserved_ = 0, peak_live_ = 0, peak_reserved_ = 0, allocations_ = 0;
};

// A block of the pool: untyped device storage of `bytes` (none when the pool runs dry), viewed as T by its
// user, who asked for `requested` bytes.
struct PoolBlock {
  Kokkos::View<unsigned char*, Layout, MemSpace> storage;
  std::int64_t bytes = 0, requested = 0;
};

class BufferPool {
 public:
  explicit BufferPool(bool dry = false) : dry_(dry) {}
  // A block of at least `bytes` (PoolRule), cached or new (then allocated under `label`, uninitialized).
  PoolBlock take(std::int64_t bytes, const std::string& label);
  void give_back(PoolBlock block);
  void clear();  // frees every cached block; blocks handed out stay valid and return to the pool as usual
  const PoolRule& rule() const { return rule_; }

 private:
  bool dry_ = false;  // the rule only: planning
  PoolRule rule_;
  std::map<std::int64_t, std::vector<PoolBlock>> free_;  // size -> free blocks, the most recently freed last
};

}  // namespace fsdpp
