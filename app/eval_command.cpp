// fsdpp eval <checkpoint | weights | model-folder> <tokens> [--deck deck.yaml] [key=value ...] [--all]: the mean loss and the
// perplexity of a model on a token file, on any number of ranks, laid out as the deck says (fully_shard,
// HSDP, tensor parallelism).
//   default  the deck's validation split of the file and its train.eval_batches micro-batches per data-parallel
//            rank: the very number training logs as val_loss for that file on that many ranks;
//   --all    every token of the file once: windows of model.context_length tokens at stride context_length
//            (the last partial window too), spread over the data-parallel ranks in micro-batches of
//            train.micro_batch; the mean over all predicted tokens.
#include "commands.hpp"

#include "fsdpp/ckpt/checkpoint.hpp"
#include "fsdpp/data/token_source.hpp"
#include "fsdpp/runtime/collective_errors.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/parallel/build_model.hpp"
#include "fsdpp/train/data_feed.hpp"
#include "fsdpp/train/evaluator.hpp"

#include <cmath>

namespace fsdpp::app {
namespace {

struct EvalArgs {
  std::string source, tokens, deck;
  std::vector<std::string> overrides;
  bool all = false;
};

struct LossSum {
  double sum = 0;           // of per-token losses
  std::int64_t tokens = 0;  // predicted
};

// Every window of the file, in micro-batches, this data-parallel rank's share; per-token losses summed.
LossSum evaluate_all(const Deck& deck, TrainModel& t) {
  const std::vector<std::uint32_t> file = load_token_source(deck.data.source, deck.data, deck.model.vocab_size, "fsdpp eval: the tokens argument");
  const std::int64_t T = deck.model.context_length, predicted = static_cast<std::int64_t>(file.size()) - 1;
  FSDPP_REQUIRE(predicted >= 1, "{} holds {} token(s): nothing to predict", deck.data.source, file.size());
  const std::int64_t windows = (predicted + T - 1) / T;
  const int dp = t.parallel->data_parallel_size(), rank = t.parallel->data_parallel_rank(), B = deck.train.micro_batch;
  // Every rank runs the same number of forwards (collectives); a rank past the end runs a window of zeros that
  // it does not count.
  const std::int64_t rounds = (windows + std::int64_t{dp} * B - 1) / (std::int64_t{dp} * B);
  LossSum local;
  std::vector<std::int32_t> inputs, targets;
  std::vector<float> losses;
  for (std::int64_t round = 0; round < rounds; ++round) {
    // Windows of one round have the same length (T, or the last window's length for all of them when the
    // file's tail is shorter), so one forward of B sequences of `len` tokens takes them.
    const std::int64_t first = (round * dp + rank) * B;
    const std::int64_t len = std::min<std::int64_t>(T, predicted - std::min(predicted, round * dp * B * T));
    inputs.assign(static_cast<std::size_t>(B * len), 0), targets.assign(inputs.size(), 0);
    std::vector<std::int64_t> counted(static_cast<std::size_t>(B), 0);
    for (int b = 0; b < B; ++b) {
      const std::int64_t start = (first + b) * T;
      for (std::int64_t i = 0; i < len && start + i < predicted; ++i) {
        inputs[static_cast<std::size_t>(b * len + i)] = static_cast<std::int32_t>(file[static_cast<std::size_t>(start + i)]);
        targets[static_cast<std::size_t>(b * len + i)] = static_cast<std::int32_t>(file[static_cast<std::size_t>(start + i + 1)]);
        counted[static_cast<std::size_t>(b)] = i + 1;
      }
    }
    View1<std::int32_t> in("eval.inputs", inputs.size()), tg("eval.targets", targets.size());
    Kokkos::deep_copy(in, HostView1<const std::int32_t>(inputs.data(), inputs.size()));
    Kokkos::deep_copy(tg, HostView1<const std::int32_t>(targets.data(), targets.size()));
    Flow flow;
    flow.B = B, flow.T = static_cast<int>(len), flow.tokens = in, flow.targets = tg, flow.training = false;
    (*t.model)(flow);
    losses.resize(inputs.size());
    Kokkos::deep_copy(HostView1<float>(losses.data(), losses.size()), Kokkos::subview(t.model->losses(),
                      std::make_pair(std::size_t{0}, losses.size())));
    for (int b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < counted[static_cast<std::size_t>(b)]; ++i)
        local.sum += losses[static_cast<std::size_t>(b * len + i)], ++local.tokens;
  }
  t.parallel->after_evaluation();
  return local;
}

int run_eval(Runtime& rt, const EvalArgs& args) {
  std::vector<std::string> overrides = args.overrides;
  overrides.push_back("data.source=" + args.tokens);
  const Deck deck = forward_only(model_deck(rt.world(), args.source, args.deck, overrides));  // no backward
  TrainModel t = build_model(rt.world(), deck);
  load_weights(rt.world(), args.source, t.model->parameters(), &deck.model);
  double mean = 0;
  std::string what;
  if (args.all) {
    const LossSum local = evaluate_all(deck, t);
    double totals[2] = {local.sum, static_cast<double>(local.tokens)};
    // Every tensor-parallel rank of a replica holds the same losses: count each data-parallel rank once.
    if (t.model->tensor_parallel().rank() != 0) totals[0] = totals[1] = 0;
    FSDPP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_DOUBLE, MPI_SUM, rt.world()));
    mean = totals[0] / totals[1];
    what = fmt::format("all {:.0f} predicted tokens of {}", totals[1], args.tokens);
  } else {
    DataFeed data(deck, t.parallel->data_parallel_size(), t.parallel->data_parallel_rank());
    mean = Evaluator(*t.model, *t.parallel, data, deck.train).run();
    what = fmt::format("the validation split of {} (data.val_fraction {}), {} micro-batch(es) of {} per data-parallel "
                       "rank", args.tokens, deck.data.val_fraction, std::max(1, deck.train.eval_batches),
                       deck.train.micro_batch);
  }
  Log::info("model: {}, from {}; {} rank(s), {}", t.model->describe(), args.source, rt.size(), t.parallel->describe());
  Log::info("eval: {}\nloss {:.6f}  perplexity {:.4f}", what, mean, std::exp(mean));
  Log::info("{{\"eval\": \"{}\", \"loss\": {:.17g}, \"perplexity\": {:.17g}, \"ranks\": {}}}", args.all ? "all" : "val", mean,
            std::exp(mean), rt.size());
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto* cli = app.add_subcommand("eval", "Mean loss and perplexity of a model on a token file (its validation split, "
                                         "or --all of it), on any number of ranks");
  auto args = std::make_shared<EvalArgs>();
  cli->add_option("source", args->source, "An fsdpp checkpoint (its deck is used), a Hugging Face model folder (its "
                                          "config.json and weights), or a weights file with --deck")
      ->required();
  cli->add_option("tokens", args->tokens, "A token file (.bin, .u16, .u32) or a corpus folder, from fsdpp tokenize")->required();
  cli->add_option("overrides", args->overrides, "section.key=value overrides of the deck (train.eval_batches, ...)");
  cli->add_option("--deck", args->deck, "The deck of the model (required for a weights file)");
  cli->add_flag("--all", args->all, "Every token of the file, not only its validation split");
  return {cli, [args](Runtime& rt) { return run_eval(rt, *args); }};
}

}  // namespace fsdpp::app
