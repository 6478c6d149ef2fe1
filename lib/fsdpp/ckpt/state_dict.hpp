#pragma once
// What a checkpoint carries for each part of training, in one state-dict style interface (the Stateful of
// torch.distributed.checkpoint): the model's parameters and the optimizer's state by reference (a save reads
// them, a load fills them in place, resharding as needed), and every other part's scalars by name (the data
// sampler's position, the schedule's learning rate, tokens seen), saved as attributes of /train.
//
// The checkpoint code knows only these names and values, not the parts that own them.
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace fsdpp {

class Parameter;
class Optimizer;

using StateScalar = std::variant<std::int64_t, std::uint64_t, double>;
using StateScalars = std::vector<std::pair<std::string, StateScalar>>;

struct StateDict {
  std::vector<Parameter*> params;   // by reference
  Optimizer* optimizer = nullptr;   // by reference: its per-parameter state and step count
  StateScalars scalars;             // by value, in the order they were added

  void set(const std::string& key, StateScalar value);
  // The value saved under `key`, of the type it was added with; UsageError naming the key otherwise.
  template <class T> T get(const std::string& key) const;
};

// (key, text) of every scalar, sorted by key: integers as "{}", doubles as "{:.17g}". What a checkpoint's layout
// digest covers, the same text h5::numeric_attrs_as_text reads back.
std::vector<std::pair<std::string, std::string>> scalars_as_text(const StateScalars& scalars);

// A part of training that a checkpoint saves and restores.
class Stateful {
 public:
  virtual ~Stateful() = default;
  virtual void state_dict(StateDict& out) const = 0;  // add this part's tensors and scalars
  // The scalars read back (with the keys and types state_dict added); tensors were already filled in place.
  virtual void load_state_dict(const StateDict& in) = 0;
};

}  // namespace fsdpp
