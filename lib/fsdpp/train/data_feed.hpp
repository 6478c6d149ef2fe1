#pragma once
// DataFeed: the deck's tokens, the global sample order over them, and the one device batch that training and
// evaluation fill in turn. A rank takes its share of each global batch (data parallelism) as micro-batches.
// Its position in the sample order is Stateful: a checkpoint saves it, a resume continues it exactly.
#include "fsdpp/ckpt/state_dict.hpp"
#include "fsdpp/config/deck.hpp"
#include "fsdpp/data/mixture.hpp"
#include "fsdpp/nn/module.hpp"

#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

class DataFeed final : public Stateful {
 public:
  // `dp_size` ranks take disjoint parts of each global batch; this one is `dp_rank`. UsageError for a deck
  // whose data cannot serve it (too short for a window, an evaluation without a validation split). The global
  // batch need not split over `dp_size` unless training batches are asked for (validation batches, `fsdpp
  // eval`, take micro_batch sequences per rank whatever the global batch).
  DataFeed(const Deck& deck, int dp_size, int dp_rank);

  const std::string& description() const { return description_; }
  std::optional<double> entropy_floor() const { return entropy_floor_; }  // synthetic corpus only
  // Forward and backward passes per optimizer step on each rank: the deck's batch split (grad_accum_steps, a
  // DeckRuleError when the global batch does not split over the data-parallel ranks); in reproducible mode one
  // per computation unit (training_forward_batch).
  int accumulation_steps() const;
  int data_parallel_size() const { return dp_size_; }
  int train_batch() const { return train_batch_; }  // sequences per training pass (load_train's)

  // Pass `micro_step` (training_forward_batch sequences) of the current global batch into flow.tokens/targets.
  void load_train(int micro_step, Flow& flow);
  // Validation batch `index` (the same windows every evaluation) into flow.tokens/targets.
  void load_val(int index, Flow& flow);
  void advance() { sampler_.advance(global_batch_); }  // after each optimizer step
  // Sequential order only: the log line when global batch `step` starts another pass over the data (over a
  // source's data, for a mixture).
  std::optional<std::string> epoch_note(std::int64_t step) const;
  // data.sources only: each source's share of the training tokens drawn so far in the whole run (a resumed run's
  // earlier steps included) beside its weight; nullopt for a single source.
  std::optional<std::string> mixture_note() const;
  const MixtureSampler& sampler() const { return sampler_; }

  void state_dict(StateDict& out) const override;
  void load_state_dict(const StateDict& in) override;  // UsageError when the data or T differ

  struct Loaded;  // the tokens and what the log says of them (data_feed.cpp)

 private:
  DataFeed(const Deck& deck, int dp_size, int dp_rank, Loaded&& data);
  void upload(Flow& flow, int B);

  MixtureSampler sampler_;  // one source (data.source) or several (data.sources)
  bool mixture_;            // data.sources: the checkpoint keeps each source's identity and count
  std::string description_;
  std::optional<double> entropy_floor_;
  int T_, micro_batch_, global_batch_, dp_size_, dp_rank_;
  int train_batch_;  // sequences per training pass: micro_batch_, or the reproducible unit
  std::vector<std::int32_t> host_inputs_, host_targets_;
  View1<std::int32_t> inputs_, targets_;  // (micro_batch, T) each
};

}  // namespace fsdpp
