#include "fsdpp/nn/buffers.hpp"

namespace fsdpp {

namespace {
// Cuts `view` from the front of `storage`, reallocating the storage when the policy says so. Zero elements: an
// empty view, and no allocation.
template <class T>
void point(View1<T>& storage, View1<T>& view, const std::string& label, std::size_t count, Growth growth) {
  const bool reallocate = growth == Growth::grow_only ? storage.extent(0) < count : storage.extent(0) != count;
  if (reallocate) {
    storage = View1<T>();  // release first: the old and the new allocation are never live together
    if (count > 0) storage = uninitialized<T>(label, count);
  }
  if (storage.extent(0) == count)
    view = storage;
  else
    view = Kokkos::subview(storage, std::make_pair(std::size_t{0}, count));
}
}  // namespace

void Buffers::assign(const std::string& label, const BufferTable& table) {
  const std::size_t n = table.rows().size();
  f32_.resize(n);
  i32_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const BufferSpec& b = table.rows()[i];
    const std::string name = label + "." + b.name;
    if (b.f32) point(f32_[i], *b.f32, name, b.count, growth_);
    if (b.i32) point(i32_[i], *b.i32, name, b.count, growth_);
  }
}

std::int64_t Buffers::bytes() const {
  std::int64_t total = 0;
  for (const auto& v : f32_) total += static_cast<std::int64_t>(v.extent(0)) * 4;
  for (const auto& v : i32_) total += static_cast<std::int64_t>(v.extent(0)) * 4;
  return total;
}

}  // namespace fsdpp
