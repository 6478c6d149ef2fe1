#include "fsdpp/nn/module.hpp"

#include "fsdpp/observe/timeline.hpp"
#include "fsdpp/runtime/error.hpp"

#include <algorithm>

namespace fsdpp {

void Module::operator()(Flow& flow, Pass pass) {
  for (auto& h : hooks_) h->before(*this, pass, flow);
  // Kernels given a shard instead of the whole tensor would read past it or compute garbage: refuse.
  for (auto& p : parameters_)
    if (p.is_sharded())
      throw UsageError(fmt::format(
          "{} of module {} with parameter '{}' still sharded (rows {}..{} of {} on this rank): run the "
          "model through its root module, whose fully_shard hooks unshard each group, or call unshard() first",
          pass == Pass::forward ? "forward" : "backward", display_name(), p.name(), p.placement()->offset_rows,
          p.placement()->offset_rows + p.placement()->local_rows, p.rows()));
  if (pass == Pass::forward) {
    if (recompute_in_backward_) checkpoint_input_ = flow.x;  // after the hooks: what forward() reads
    forward(flow);
  } else if (pass == Pass::backward_weight) {
    backward_weight(flow);  // from what backward recorded: nothing to recompute
  } else {
    if (recompute_in_backward_) {
      const TimelineScope span(recompute_region_);
      recompute(flow);
    }
    backward(flow);
  }
  // After-hooks run in reverse registration order, so hooks nest like scopes.
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) (*it)->after(*this, pass, flow);
}

// The replay of forward() that rebuilds the activations of a checkpointed module, on the flow of its backward
// (the same batch) with the residual stream it was given in forward. What the replay leaves in the flow is
// dropped: backward's flow is the caller's.
void Module::recompute(const Flow& flow) {
  FSDPP_CHECK(checkpoint_input_.data() != nullptr,
              "backward of {} (recompute_in_backward) without a forward since it was set: there is no input to "
              "recompute its activations from", display_name());
  Flow replay = flow;
  replay.x = checkpoint_input_;
  recomputing_ = true;
  try {
    forward(replay);
  } catch (...) {
    recomputing_ = false;
    throw;
  }
  recomputing_ = false;
}

void Module::dry_run(Flow& flow, Pass pass) {
  for (auto& h : hooks_) h->before(*this, pass, flow);
  if (pass == Pass::forward) {
    for (Module* child : children_)
      if (runs_child(*child)) child->dry_run(flow, pass);
  } else {
    for (auto it = children_.rbegin(); it != children_.rend(); ++it)
      if (runs_child(**it)) (*it)->dry_run(flow, pass);
  }
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) (*it)->after(*this, pass, flow);
}

Parameter& Module::add_parameter(const std::string& local_name, std::vector<std::int64_t> shape, InitRule init,
                                 ParamRole role) {
  parameters_.emplace_back(local_name, std::move(shape), init, role);
  Parameter& p = parameters_.back();
  p.name_ = path_.empty() ? local_name : path_ + "." + local_name;
  return p;
}

void Module::add_child(Module& child, const std::string& name) {
  child.parent_ = this;
  child.name_in_parent_ = name;
  children_.push_back(&child);
  child.set_path(path_.empty() ? name : path_ + "." + name);
}

void Module::set_path(const std::string& path) {
  path_ = path;
  for (auto& p : parameters_) p.name_ = path_.empty() ? p.local_name_ : path_ + "." + p.local_name_;
  // A child's path is the name it was added with (which may itself be dotted: "mlp.experts") under the new prefix.
  for (Module* child : children_)
    child->set_path(path_.empty() ? child->name_in_parent_ : path_ + "." + child->name_in_parent_);
}

void Module::select_activation_slot(int slot) {
  if (slot != slot_) {
    const std::size_t need = static_cast<std::size_t>(std::max(slot, slot_)) + 1;
    if (slot_inputs_.size() < need) slot_inputs_.resize(need);
    slot_inputs_[static_cast<std::size_t>(slot_)] = checkpoint_input_;
    checkpoint_input_ = slot_inputs_[static_cast<std::size_t>(slot)];
    slot_inputs_[static_cast<std::size_t>(slot)] = View1<float>();
    swap_activation_slot(slot_, slot);
    slot_ = slot;
  }
  for (Module* child : children_) child->select_activation_slot(slot);
}

void Module::remove_child(const Module& child) {
  children_.erase(std::remove(children_.begin(), children_.end(), &child), children_.end());
}

std::vector<Parameter*> Module::parameters(bool recurse) {
  std::vector<Parameter*> out;
  for (auto& p : parameters_)
    if (std::find(dropped_.begin(), dropped_.end(), &p) == dropped_.end()) out.push_back(&p);
  if (recurse)
    for (Module* child : children_)
      for (Parameter* p : child->parameters(true)) out.push_back(p);
  return out;
}

std::vector<const Parameter*> Module::parameters(bool recurse) const {
  std::vector<const Parameter*> out;
  for (const auto& p : parameters_)
    if (std::find(dropped_.begin(), dropped_.end(), &p) == dropped_.end()) out.push_back(&p);
  if (recurse)
    for (const Module* child : children_)
      for (const Parameter* p : child->parameters(true)) out.push_back(p);
  return out;
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out{this};
  for (Module* child : children_)
    for (Module* m : child->modules()) out.push_back(m);
  return out;
}

void Module::to_empty() {
  for (Parameter* p : parameters()) {
    if (p->is_meta()) p->allocate();
  }
}

void Module::reset_parameters(std::uint64_t seed) {
  for (Parameter* p : parameters()) {
    // A shard fills only its real rows, with the values those elements have in the whole tensor (under tensor
    // parallelism a piece may be a column slice of the whole tensor's rows).
    const std::int64_t row = p->row_size(), stride = p->global_row_size();
    for (const GlobalPiece& piece : p->global_pieces()) {
      const auto begin = static_cast<std::size_t>(piece.local_row * row);
      const auto part = Kokkos::subview(p->value(), std::make_pair(begin, begin + static_cast<std::size_t>(piece.rows * row)));
      fill_initial_values(part, p->init(), seed, p->name(), piece.global_row * stride + piece.global_col, piece.cols, stride);
    }
  }
}

void Module::zero_grad() {
  for (Parameter* p : parameters()) {
    if (!p->grad().extent(0)) continue;
    if (p->host_resident()) {  // offloaded: a memset kernel would write host memory across PCIe
      float* grad = p->grad().data();
      for_each_index("fsdpp::zero_offloaded_grad", true, static_cast<std::int64_t>(p->grad().extent(0)),
                     KOKKOS_LAMBDA(const std::int64_t j) { grad[j] = 0.0f; });
    } else {
      zero_grads_.add(p->grad().data(), nullptr, static_cast<std::int64_t>(p->grad().extent(0)));
    }
  }
  zero_grads_.run(PieceOp::zero);  // on the stream: no fence, one launch however many parameters
}

}  // namespace fsdpp
