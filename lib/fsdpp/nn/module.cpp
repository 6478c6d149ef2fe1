#include "fsdpp/nn/module.hpp"

namespace fsdpp {

void Module::operator()(Flow& flow, Pass pass) {
  for (auto& h : hooks_) h->before(*this, pass);
  if (pass == Pass::forward) forward(flow);
  else backward(flow);
  // After-hooks run in reverse registration order, so hooks nest like scopes.
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) (*it)->after(*this, pass);
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
  children_.push_back(&child);
  child.set_path(path_.empty() ? name : path_ + "." + name);
}

void Module::set_path(const std::string& path) {
  path_ = path;
  for (auto& p : parameters_) p.name_ = path_.empty() ? p.local_name_ : path_ + "." + p.local_name_;
  // A child's path is its own last component under the new prefix.
  for (Module* child : children_) {
    const std::string& old = child->path_;
    const std::string leaf = old.substr(old.rfind('.') == std::string::npos ? 0 : old.rfind('.') + 1);
    child->set_path(path_.empty() ? leaf : path_ + "." + leaf);
  }
}

std::vector<Parameter*> Module::parameters(bool recurse) {
  std::vector<Parameter*> out;
  for (auto& p : parameters_) out.push_back(&p);
  if (recurse)
    for (Module* child : children_)
      for (Parameter* p : child->parameters(true)) out.push_back(p);
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
    if (!p->is_meta()) continue;
    p->value = uninitialized<float>(p->name(), static_cast<std::size_t>(p->numel()));
    p->grad = View1<float>(p->name() + ".grad", static_cast<std::size_t>(p->numel()));
  }
}

void Module::reset_parameters(std::uint64_t seed) {
  for (Parameter* p : parameters()) fill_initial_values(p->value, p->init(), seed, p->name(), 0);
}

void Module::zero_grad() {
  for (Parameter* p : parameters())
    if (p->grad.extent(0)) Kokkos::deep_copy(p->grad, 0.0f);
}

}  // namespace fsdpp
