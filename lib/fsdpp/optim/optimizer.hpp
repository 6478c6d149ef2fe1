#pragma once
// Optimizer: what AdamW and SGD share. It holds the parameters it was built from, counts steps, decides which
// parameters decay, and guards against stale storage: an optimizer keeps per-parameter state sized and
// aligned to the storage each parameter had when the optimizer was built, so if that storage is replaced
// afterwards (fully_shard swaps full tensors for shards, to_empty gives a meta parameter memory) the state no
// longer matches and every step would silently update the wrong memory. step() checks first and throws.
//
// Parameters are updated over their local storage, value.extent(0) elements, which under FSDP is this rank's
// shard; the update is elementwise, so a shard is updated exactly as the same elements of the full tensor.
#include "fsdpp/nn/parameter.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fsdpp {

// Default decay rules (GPT-2/llm.c, nanoGPT): matrices decay; biases, LayerNorm weights and embeddings do not
// unless asked.
inline bool role_decays(ParamRole role, bool decay_embeddings, bool decay_norms, bool decay_biases) {
  switch (role) {
    case ParamRole::weight: return true;
    case ParamRole::embedding: return decay_embeddings;
    case ParamRole::norm: return decay_norms;
    case ParamRole::bias: return decay_biases;
  }
  return false;
}

class Optimizer {
 public:
  // `kind` names the optimizer in messages ("AdamW"). Throws UsageError for a null or repeated parameter.
  Optimizer(std::vector<Parameter*> params, std::string kind);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter from its current gradient, at learning rate `lr`. Throws UsageError for
  // stale storage or a missing gradient before touching anything.
  virtual void step(float lr) = 0;

  // The per-parameter state tensors by name (AdamW: exp_avg, exp_avg_sq; SGD: momentum_buffer), each with the
  // parameter's storage extent: what checkpoints save and load.
  virtual std::vector<std::pair<std::string, View1<float>>> state_tensors(const Parameter& p) const = 0;
  // Name and value of every hyperparameter (flags as 0/1), recorded with the state in checkpoints.
  virtual std::vector<std::pair<std::string, double>> hyperparameters() const = 0;

  std::int64_t steps() const { return steps_; }
  void set_steps(std::int64_t steps);  // checkpoint load, together with the state views of the subclass
  const std::vector<Parameter*>& parameters() const { return params_; }
  const std::string& kind() const { return kind_; }

 protected:
  // The stale-storage and gradient checks; subclasses call it first in step().
  void check_parameters() const;
  // Position of `p` in parameters(); throws UsageError when the optimizer does not hold it.
  std::size_t index_of(const Parameter& p) const;
  // A zeroed state tensor with p's storage extent, where p lives: offload memory for a CPU-offloaded shard
  // (FSDP2 keeps its optimizer state on the host and steps there), the compute space otherwise.
  View1<float> state_tensor(const Parameter& p, const std::string& label);

  std::vector<Parameter*> params_;
  std::int64_t steps_ = 0;

 private:
  std::string kind_;
  std::vector<const float*> data_;    // value.data() at construction
  std::vector<std::size_t> extent_;   // value.extent(0) at construction
  std::vector<OffloadBuffer> offloaded_state_;  // owners of the state tensors in offload memory
};

}  // namespace fsdpp
