#include "fsdpp/train/data_feed.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/data/synthetic_corpus.hpp"
#include "fsdpp/data/token_source.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace fsdpp {
struct DataFeed::Loaded {
  std::vector<MixtureInput> sources;
  std::optional<double> entropy_floor;
  std::string description;
};

namespace {

DataFeed::Loaded load_tokens_of(const Deck& deck) {
  check_data_sources(deck.data);
  DataFeed::Loaded d;
  const int V = deck.model.vocab_size;
  if (!deck.data.sources.empty()) {
    double total = 0;
    for (const DataSource& s : deck.data.sources) total += s.weight;
    d.description = fmt::format("a mixture of {} sources", deck.data.sources.size());
    for (const DataSource& s : deck.data.sources) {
      d.sources.push_back({s.path, load_token_source(s.path, deck.data, V, s.where), s.weight});
      d.description += fmt::format("\n  {} (weight {:.4g}, {:.1f}%): {} tokens", s.path, s.weight,
                                   100.0 * s.weight / total, d.sources.back().tokens.size());
    }
    return d;
  }
  if (deck.data.source == "synthetic") {
    SyntheticCorpus corpus(deck.run.seed, V);
    // Windows are drawn with replacement from a stationary source, so a few million tokens give variety
    // enough; more only costs memory on every rank.
    const std::int64_t n = std::max<std::int64_t>(std::int64_t{1} << 21, 64LL * deck.model.context_length);
    d.sources.push_back({"synthetic", corpus.generate(n), 1.0});
    d.entropy_floor = corpus.entropy_rate_nats();
    d.description = fmt::format("synthetic Markov corpus (V {}, {} successors, seed {}), {} tokens, entropy rate "
                                "{:.4f} nats/token", V, corpus.successors(), deck.run.seed, n, *d.entropy_floor);
    return d;
  }
  const std::string& path = deck.data.source;
  d.sources.push_back({path, load_token_source(path, deck.data, V, "data.source"), 1.0});
  d.description = fmt::format("{} ({} tokens)", path, d.sources.back().tokens.size());
  return d;
}

MixtureSampler make_sampler(DataFeed::Loaded& d, const Deck& deck) {
  return MixtureSampler(std::move(d.sources), deck.model.context_length, deck.data.val_fraction, deck.run.seed,
                        deck.data.order == DataOrder::sequential ? SampleOrder::sequential : SampleOrder::shuffled);
}

}  // namespace

DataFeed::DataFeed(const Deck& deck, int dp_size, int dp_rank)
    : DataFeed(deck, dp_size, dp_rank, load_tokens_of(deck)) {}

DataFeed::DataFeed(const Deck& deck, int dp_size, int dp_rank, Loaded&& data)
    : sampler_(make_sampler(data, deck)), mixture_(!deck.data.sources.empty()),
      description_(std::move(data.description)), entropy_floor_(data.entropy_floor),
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
  if (sampler_.order() != SampleOrder::sequential || step == 0) return std::nullopt;
  std::string note;
  for (int k = 0; k < sampler_.sources(); ++k) {
    const std::int64_t epoch = sampler_.epoch_of(k, step, global_batch_);
    if (epoch == sampler_.epoch_of(k, step - 1, global_batch_)) continue;
    note += fmt::format("{}data: {}epoch {} begins at step {}: the {} training windows of {} tokens were all seen; "
                        "wrapping to the start", note.empty() ? "" : "\n",
                        mixture_ ? fmt::format("source {} ({}): ", k + 1, sampler_.path(k)) : "", epoch, step,
                        sampler_.source(k).sequential_windows(), T_ + 1);
  }
  return note.empty() ? std::nullopt : std::optional<std::string>(note);
}

std::optional<std::string> DataFeed::mixture_note() const {
  if (!mixture_) return std::nullopt;
  const std::vector<std::int64_t>& drawn = sampler_.sequences_drawn();
  std::int64_t total = 0;
  for (const std::int64_t n : drawn) total += n;
  std::string note = fmt::format("data: tokens drawn by source over {} training tokens (share, weight):", total * T_);
  for (int k = 0; k < sampler_.sources(); ++k) {
    const double share = total > 0 ? static_cast<double>(drawn[static_cast<std::size_t>(k)]) / total : 0.0;
    note += fmt::format("\n  {}: {} tokens ({:.2f}%, weight {:.2f}%)", sampler_.path(k),
                        drawn[static_cast<std::size_t>(k)] * T_, 100.0 * share, 100.0 * sampler_.weight(k));
  }
  return note;
}

// The sample order's position, valid for any data-parallel size, and the identity of the data it was on. A single
// source keeps the keys it always had (older checkpoints load); a mixture adds each source's identity and count.
void DataFeed::state_dict(StateDict& out) const {
  const MixtureState s = sampler_.state();
  out.set("sampler_seed", s.seed);
  out.set("sampler_next_step", s.next_step);
  out.set("sampler_num_tokens", sampler_.num_tokens());
  out.set("sampler_seq_len", s.seq_len);
  if (!mixture_) return;
  out.set("sampler_sources", static_cast<std::int64_t>(s.sources.size()));
  for (std::size_t k = 0; k < s.sources.size(); ++k) {
    const std::string key = fmt::format("sampler_source_{}_", k + 1);
    out.set(key + "path_hash", s.sources[k].path_hash);
    out.set(key + "tokens", s.sources[k].num_tokens);
    out.set(key + "weight", s.sources[k].weight);
    out.set(key + "sequences", s.sources[k].sequences);
  }
}

void DataFeed::load_state_dict(const StateDict& in) {
  MixtureState s = sampler_.state();  // this run's identities: a single source's are not saved
  s.seed = in.get<std::uint64_t>("sampler_seed");
  s.next_step = in.get<std::int64_t>("sampler_next_step");
  s.seq_len = in.get<std::int64_t>("sampler_seq_len");
  const auto num_tokens = in.get<std::int64_t>("sampler_num_tokens");
  if (!mixture_) {
    FSDPP_REQUIRE(num_tokens == sampler_.num_tokens() && s.seq_len == T_,
                  "the saved data loader state is for {} tokens with sequence length {}, but this run has {} tokens "
                  "with sequence length {}; resume with the same data and model.context_length, or start a new run",
                  num_tokens, s.seq_len, sampler_.num_tokens(), T_);
    s.sources[0].sequences = s.next_step * global_batch_;
    sampler_.set_state(s);
    return;
  }
  const auto saved_sources = in.get<std::int64_t>("sampler_sources");
  FSDPP_REQUIRE(saved_sources == sampler_.sources(),
                "the checkpoint was trained on {} data source(s), but this deck's data.sources gives {}; resume with "
                "the same data.sources, or start a new run", saved_sources, sampler_.sources());
  for (std::size_t k = 0; k < s.sources.size(); ++k) {
    const std::string key = fmt::format("sampler_source_{}_", k + 1);
    s.sources[k] = {in.get<std::uint64_t>(key + "path_hash"), in.get<std::int64_t>(key + "tokens"),
                    in.get<double>(key + "weight"), in.get<std::int64_t>(key + "sequences")};
  }
  sampler_.set_state(s);
}

}  // namespace fsdpp
