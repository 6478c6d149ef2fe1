#include "fsdpp/train/data_feed.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/data/synthetic_corpus.hpp"
#include "fsdpp/data/token_file.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace fsdpp {
struct DataFeed::Loaded {
  std::vector<std::uint32_t> tokens;
  std::optional<double> entropy_floor;
  std::string description;
};

namespace {

DataFeed::Loaded load_tokens_of(const Deck& deck) {
  DataFeed::Loaded d;
  const int V = deck.model.vocab_size;
  if (deck.data.source == "synthetic") {
    SyntheticCorpus corpus(deck.run.seed, V);
    // Windows are drawn with replacement from a stationary source, so a few million tokens give variety
    // enough; more only costs memory on every rank.
    const std::int64_t n = std::max<std::int64_t>(std::int64_t{1} << 21, 64LL * deck.model.context_length);
    d.tokens = corpus.generate(n);
    d.entropy_floor = corpus.entropy_rate_nats();
    d.description = fmt::format("synthetic Markov corpus (V {}, {} successors, seed {}), {} tokens, entropy rate "
                                "{:.4f} nats/token", V, corpus.successors(), deck.run.seed, n, *d.entropy_floor);
    return d;
  }
  const std::string& path = deck.data.source;
  switch (deck.data.format) {
    case DataFormat::automatic: d.tokens = load_tokens(path, V); break;
    case DataFormat::gpt2: d.tokens = load_tokens(path, TokenFormat::gpt2_bin, V); break;
    case DataFormat::uint16: d.tokens = load_tokens(path, TokenFormat::raw_u16, V); break;
    case DataFormat::uint32: d.tokens = load_tokens(path, TokenFormat::raw_u32, V); break;
  }
  d.description = fmt::format("{} ({} tokens)", path, d.tokens.size());
  return d;
}

WindowSampler make_sampler(DataFeed::Loaded& d, const Deck& deck) {
  return WindowSampler(std::move(d.tokens), deck.model.context_length, deck.data.val_fraction, deck.run.seed,
                       deck.data.order == DataOrder::sequential ? SampleOrder::sequential : SampleOrder::shuffled);
}

}  // namespace

DataFeed::DataFeed(const Deck& deck, int dp_size, int dp_rank)
    : DataFeed(deck, dp_size, dp_rank, load_tokens_of(deck)) {}

DataFeed::DataFeed(const Deck& deck, int dp_size, int dp_rank, Loaded&& data)
    : sampler_(make_sampler(data, deck)), description_(std::move(data.description)), entropy_floor_(data.entropy_floor),
      T_(deck.model.context_length), micro_batch_(deck.train.micro_batch), global_batch_(deck.train.global_batch),
      dp_size_(dp_size), dp_rank_(dp_rank), train_batch_(training_forward_batch(deck.train)),
      host_inputs_(static_cast<std::size_t>(micro_batch_) * T_), host_targets_(host_inputs_.size()),
      inputs_("batch.inputs", host_inputs_.size()), targets_("batch.targets", host_inputs_.size()) {
  FSDPP_REQUIRE(!(deck.train.eval_interval > 0 && !sampler_.has_val()),
                "train.eval_interval is {} but the data has no validation split; set data.val_fraction > 0 or "
                "train.eval_interval: 0", deck.train.eval_interval);
}

int DataFeed::accumulation_steps() const {
  grad_accum_steps(global_batch_, micro_batch_, dp_size_);  // the deck's split must hold in either mode
  return grad_accum_steps(global_batch_, train_batch_, dp_size_);
}

void DataFeed::upload(Flow& flow, int B) {
  const std::size_t n = static_cast<std::size_t>(B) * T_;
  const auto first = std::make_pair(std::size_t{0}, n);
  Kokkos::deep_copy(Kokkos::subview(inputs_, first), HostView1<std::int32_t>(host_inputs_.data(), n));
  Kokkos::deep_copy(Kokkos::subview(targets_, first), HostView1<std::int32_t>(host_targets_.data(), n));
  flow.B = B;
  flow.T = T_;
  flow.tokens = Kokkos::subview(inputs_, first);
  flow.targets = Kokkos::subview(targets_, first);
}

void DataFeed::load_train(int micro_step, Flow& flow) {
  const std::int64_t first = micro_batch_first_sequence(global_batch_, train_batch_, dp_size_, dp_rank_, micro_step);
  sampler_.fill_train_batch(global_batch_, first, train_batch_, host_inputs_.data(), host_targets_.data());
  upload(flow, train_batch_);
}

void DataFeed::load_val(int index, Flow& flow) {
  // The same fixed windows every evaluation, split over ranks like training.
  sampler_.fill_batch(Split::val, index, static_cast<std::int64_t>(micro_batch_) * dp_size_,
                      static_cast<std::int64_t>(dp_rank_) * micro_batch_, micro_batch_, host_inputs_.data(),
                      host_targets_.data());
  upload(flow, micro_batch_);
}

std::optional<std::string> DataFeed::epoch_note(std::int64_t step) const {
  if (sampler_.order() != SampleOrder::sequential || step == 0 ||
      sampler_.epoch_of(step, global_batch_) == sampler_.epoch_of(step - 1, global_batch_))
    return std::nullopt;
  return fmt::format("data: epoch {} begins at step {}: the {} training windows of {} tokens were all seen; wrapping "
                     "to the start", sampler_.epoch_of(step, global_batch_), step, sampler_.sequential_windows(), T_ + 1);
}

// The sample order's position, valid for any data-parallel size, and the identity of the data it was on.
void DataFeed::state_dict(StateDict& out) const {
  const SamplerState s = sampler_.state();
  out.set("sampler_seed", s.seed);
  out.set("sampler_next_step", s.next_step);
  out.set("sampler_num_tokens", s.num_tokens);
  out.set("sampler_seq_len", s.seq_len);
}

void DataFeed::load_state_dict(const StateDict& in) {
  SamplerState s;
  s.seed = in.get<std::uint64_t>("sampler_seed");
  s.next_step = in.get<std::int64_t>("sampler_next_step");
  s.num_tokens = in.get<std::int64_t>("sampler_num_tokens");
  s.seq_len = in.get<std::int64_t>("sampler_seq_len");
  sampler_.set_state(s);
}

}  // namespace fsdpp
