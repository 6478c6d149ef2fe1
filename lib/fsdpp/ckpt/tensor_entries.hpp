#pragma once
// Internal to lib/fsdpp/ckpt (save and load): which tensors a checkpoint holds and how their rows split.
#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/nn/parameter.hpp"
#include "fsdpp/optim/optimizer.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>

namespace fsdpp::ckpt_detail {

// One tensor of a checkpoint: a parameter's value or one of its optimizer states.
struct TensorEntry {
  std::string group;  // "/model/h.0.ln_1.weight" or "/optim/h.0.ln_1.weight/exp_avg"
  const Parameter* param;
  View1<float> view;
};

inline std::vector<TensorEntry> tensors_of(const CheckpointContents& c) {
  std::vector<TensorEntry> out;
  for (const Parameter* p : c.params) out.push_back({"/model/" + p->name(), p, p->value()});
  if (c.optimizer)
    for (const Parameter* p : c.params)
      if (p->trainable())  // the others have no optimizer state (Parameter::set_trainable)
        for (auto& [state, view] : c.optimizer->state_tensors(*p)) out.push_back({"/optim/" + p->name() + "/" + state, p, view});
  return out;
}

// Copies the parameter's real local elements (local_numel(), in its storage's layout) out of `whole`, the whole
// tensor (row-major, global shape).
inline void take_local_elements(const Parameter& p, const float* whole, float* local) {
  const std::int64_t row = p.row_size(), stride = p.global_row_size();
  for (const GlobalPiece& piece : p.global_pieces())
    for (std::int64_t r = 0; r < piece.rows; ++r)
      std::copy_n(whole + (piece.global_row + r) * stride + piece.global_col, piece.cols, local + (piece.local_row + r) * row);
}

// The whole tensor's flat index of element `local` of the parameter's storage (for messages).
inline std::size_t global_index_of(const Parameter& p, std::size_t local) {
  const auto row = static_cast<std::size_t>(p.row_size()), stride = static_cast<std::size_t>(p.global_row_size());
  const std::size_t r = row ? local / row : 0, c = row ? local % row : 0;
  for (const GlobalPiece& piece : p.global_pieces())
    if (r >= static_cast<std::size_t>(piece.local_row) && r < static_cast<std::size_t>(piece.local_row + piece.rows))
      return (static_cast<std::size_t>(piece.global_row) + r - static_cast<std::size_t>(piece.local_row)) * stride +
             static_cast<std::size_t>(piece.global_col) + c;
  return local;
}

inline std::uint64_t checksum(const float* data, std::size_t count) { return XXH64(data, count * sizeof(float), 0); }


}  // namespace fsdpp::ckpt_detail
