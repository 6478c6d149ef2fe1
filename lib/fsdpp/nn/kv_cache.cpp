#include "fsdpp/nn/kv_cache.hpp"

#include <string>

namespace fsdpp {

KvCache::KvCache(int blocks, int sequences, int capacity, int kv_width, const std::vector<bool>* kept)
    : sequences_(sequences), capacity_(capacity), kv_width_(kv_width) {
  const auto n = static_cast<std::size_t>(std::int64_t{sequences} * capacity * kv_width);
  for (int b = 0; b < blocks; ++b) {
    if (kept && !(*kept)[static_cast<std::size_t>(b)]) {  // another stage's block
      k_.emplace_back(), v_.emplace_back();
      continue;
    }
    ++stored_;
    // Zeroed: positions not written yet are never read (attention stops at each row's position), but a cache of
    // defined values keeps sanitizers and debuggers quiet.
    k_.emplace_back("kv_cache.k" + std::to_string(b), n);
    v_.emplace_back("kv_cache.v" + std::to_string(b), n);
  }
}

std::int64_t KvCache::bytes_for(int blocks, int sequences, int capacity, int kv_width) {
  return 2 * std::int64_t{blocks} * sequences * capacity * kv_width * 4;
}

}  // namespace fsdpp
