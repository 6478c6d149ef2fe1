#pragma once
// Buffers: a set of device buffers that a model allocates together for one batch shape (a block's activations,
// the blocks' backward scratch, the head's buffers), described by ONE table of (name, elements, view). The same
// table allocates them (ensure) and counts them (bytes_for), so what `fsdpp plan` predicts and what a run
// allocates cannot drift apart: a buffer is declared once, in its table.
//
// Growth: exact sets reallocate when the shape changes (a buffer is then exactly its table's size); grow-only
// sets keep the largest allocation seen and cut each view from its front (a shared recomputation set serves
// blocks and evaluation batches of any shape without reallocating). The front of an allocation has the
// allocation's alignment, so the same kernels give the same bits either way.
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// One buffer: `count` elements of 4 bytes (f32, or int32 token ids), and the view to point at them.
struct BufferSpec {
  std::string name;
  std::size_t count = 0;
  View1<float>* f32 = nullptr;
  View1<std::int32_t>* i32 = nullptr;
};

class BufferTable {
 public:
  BufferTable& add(std::string name, std::size_t count, View1<float>& view) {
    rows_.push_back({std::move(name), count, &view, nullptr});
    return *this;
  }
  BufferTable& add(std::string name, std::size_t count, View1<std::int32_t>& view) {
    rows_.push_back({std::move(name), count, nullptr, &view});
    return *this;
  }
  const std::vector<BufferSpec>& rows() const { return rows_; }
  // What the table's buffers take, in bytes: what Buffers::ensure allocates for it (exact) or at least.
  std::int64_t bytes() const {
    std::int64_t total = 0;
    for (const BufferSpec& b : rows_) total += static_cast<std::int64_t>(b.count) * 4;
    return total;
  }

 private:
  std::vector<BufferSpec> rows_;
};

enum class Growth { exact, grow_only };

class Buffers {
 public:
  explicit Buffers(Growth growth) : growth_(growth) {}
  // Points every view of the table at an allocation of its size ("<label>.<name>"). The table is built only
  // when the shape key (B, T) differs from the last call's, so an unchanged shape costs one comparison.
  template <class MakeTable> void ensure(const std::string& label, int B, int T, const MakeTable& make_table) {
    if (B == B_ && T == T_) return;
    B_ = B, T_ = T;
    assign(label, make_table());
  }
  std::int64_t bytes() const;  // allocated now

 private:
  void assign(const std::string& label, const BufferTable& table);

  Growth growth_;
  int B_ = 0, T_ = 0;
  std::vector<View1<float>> f32_;  // the allocations behind the views, by table row
  std::vector<View1<std::int32_t>> i32_;
};

}  // namespace fsdpp
