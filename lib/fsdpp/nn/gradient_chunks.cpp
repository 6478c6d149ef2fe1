#include "fsdpp/nn/gradient_chunks.hpp"

namespace fsdpp {

void GradientChunks::configure(int rows, std::array<std::int64_t, 2> elements) {
  FSDPP_CHECK(rows >= 0, "reproducible chunks of {} rows", rows);
  rows_ = rows;
  elements_ = elements;
  scratch_[0] = scratch_[1] = View1<float>();  // allocated by the first backward: a planning model never runs one
}

View1<float> GradientChunks::zeroed(int slot, const Parameter* p) {
  if (!p) return View1<float>();
  const auto n = static_cast<std::size_t>(p->numel());
  if (scratch_[slot].extent(0) == 0)
    scratch_[slot] = View1<float>("fsdpp::gradient_chunk_scratch", static_cast<std::size_t>(elements_[slot]));
  FSDPP_CHECK(n <= scratch_[slot].extent(0), "reproducible chunks: {} has {} elements, the scratch {}", p->name(), n,
              scratch_[slot].extent(0));
  const View1<float> part = Kokkos::subview(scratch_[slot], std::make_pair(std::size_t{0}, n));
  Kokkos::deep_copy(part, 0.0f);
  return part;
}

void GradientChunks::add(const Parameter* p, const View1<float>& part) {
  if (!p) return;
  FSDPP_CHECK(p->grad_words().active(), "reproducible chunks: {} has no exact gradient words during backward (is "
              "it under fully_shard with train.reproducible?)", p->name());
  add_cut_into_slots(p->grad_words(), part);
}

}  // namespace fsdpp
