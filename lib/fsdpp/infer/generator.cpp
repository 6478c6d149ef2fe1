#include "fsdpp/infer/generator.hpp"

#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/nn/make_model.hpp"

#include <algorithm>
#include <chrono>

namespace fsdpp {
namespace {

using Clock = std::chrono::steady_clock;

View1<std::int32_t> to_device(const std::vector<std::int32_t>& host, const char* label) {
  View1<std::int32_t> v(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), host.size());
  Kokkos::deep_copy(v, HostView1<const std::int32_t>(host.data(), host.size()));
  return v;
}

// One decode forward of `rows` (token, sequence, position) and each sequence's last row; the logits on the host.
struct Rows {
  std::vector<std::int32_t> tokens, sequence, position, last_row;
  void add(int token, int s, int pos) {
    last_row[static_cast<std::size_t>(s)] = static_cast<std::int32_t>(tokens.size());
    tokens.push_back(token), sequence.push_back(s), position.push_back(pos);
  }
};

void forward(CausalLM& model, KvCache& cache, Rows& rows, DecodeStep& step, DecodeStageLink* link) {
  step.N = static_cast<int>(rows.tokens.size());
  step.tokens = to_device(rows.tokens, "generate.tokens");
  step.sequence = to_device(rows.sequence, "generate.sequence");
  step.position = to_device(rows.position, "generate.position");
  step.last_row = to_device(rows.last_row, "generate.last_row");
  step.cache = &cache;
  step.stage_link = link;
  Flow flow;
  flow.B = 1, flow.T = step.N;
  flow.training = false;
  flow.decode = &step;
  model(flow);
}

}  // namespace

Deck generation_layout(Deck deck, int ranks) {
  deck = forward_only(std::move(deck));  // no backward: training's reshard group does not apply
  deck.fsdp.strategy = ShardStrategy::full_shard;
  deck.fsdp.offload = OffloadPolicy::none;
  deck.mesh.dp_replicate = 0;  // absent
  deck.mesh.dp_shard = 1;
  deck.mesh.tp = ranks;
  deck.mesh.tp_sequence_parallel = false;
  deck.mesh.ep = 1;  // every rank decodes the same rows: the experts stay whole (unsplit by tp)
  return deck;
}

GenerationMemory plan_generation(const Deck& layout, int ranks, int sequences, int capacity, int prefill_rows) {
  FSDPP_REQUIRE(capacity <= layout.model.context_length, "--tokens {}: a sequence holds at most model.context_length = "
                "{} tokens (prompt and generated)", capacity, layout.model.context_length);
  const Deck deck = generation_layout(layout, ranks);
  const auto model = make_model(deck.model);
  const auto parallel = parallelize_for_planning(*model, deck, ranks);  // the tensor-parallel shapes
  const auto& lm = dynamic_cast<const CausalLM&>(*model);
  GenerationMemory m;
  for (const Parameter* p : lm.parameters()) m.parameters += 4 * p->numel();
  m.kv_cache = lm.kv_cache_bytes_for(sequences, capacity);
  m.decode_buffers = lm.decode_buffer_bytes_for(sequences, capacity, std::min(sequences * capacity, prefill_rows));
  return m;
}

Generation generate(CausalLM& model, const std::vector<std::vector<int>>& prompts, const GenerationOptions& options) {
  options.sampling.validate();
  FSDPP_REQUIRE(options.max_new_tokens >= 1, "--max-new-tokens is {}; it must be at least 1", options.max_new_tokens);
  FSDPP_REQUIRE(!prompts.empty(), "no prompt to continue");
  const int S = static_cast<int>(prompts.size()), V = model.vocab_size(), context = model.context_length();
  std::size_t longest = 0;
  for (int s = 0; s < S; ++s) {
    const auto& p = prompts[static_cast<std::size_t>(s)];
    FSDPP_REQUIRE(!p.empty(), "prompt {} is empty: generation continues a prompt of at least one token", s + 1);
    FSDPP_REQUIRE(p.size() + static_cast<std::size_t>(options.max_new_tokens) <= static_cast<std::size_t>(context),
                  "prompt {} has {} tokens; with --max-new-tokens {} that is {}, more than the model's context of {} "
                  "(model.context_length): shorten the prompt or ask for at most {} new tokens", s + 1, p.size(),
                  options.max_new_tokens, p.size() + static_cast<std::size_t>(options.max_new_tokens), context,
                  std::max<std::int64_t>(0, context - static_cast<std::int64_t>(p.size())));
    for (int id : p)
      FSDPP_REQUIRE(id >= 0 && id < V, "prompt {} has token id {}, outside the model's vocabulary of {}", s + 1, id, V);
    longest = std::max(longest, p.size());
  }
  KvCache cache = model.make_kv_cache(S, static_cast<int>(longest) + options.max_new_tokens);
  Generation out;
  out.tokens.resize(static_cast<std::size_t>(S));
  out.cache_bytes = cache.bytes();
  std::vector<int> length(static_cast<std::size_t>(S));
  std::vector<bool> done(static_cast<std::size_t>(S), false);
  if (options.keep_prefill_logits) out.prefill_logits.resize(static_cast<std::size_t>(S) * static_cast<std::size_t>(V));
  auto choose = [&](const DecodeStep& step, int s, int produced) {
    if (produced == 0 && options.keep_prefill_logits)
      std::copy_n(step.logits.data() + static_cast<std::ptrdiff_t>(std::int64_t{s} * V), V,
                  out.prefill_logits.data() + static_cast<std::ptrdiff_t>(std::int64_t{s} * V));
    const int token = sample_token(step.logits.data() + static_cast<std::ptrdiff_t>(std::int64_t{s} * V), V,
                                   options.sampling, s, produced);
    out.tokens[static_cast<std::size_t>(s)].push_back(token);
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end() ||
        produced + 1 == options.max_new_tokens)
      done[static_cast<std::size_t>(s)] = true;
  };

  // Prefill: every prompt token, in forwards of at most prefill_rows rows; each sequence's first new token from
  // the logits of its last row, in the forward that holds it.
  FSDPP_REQUIRE(options.prefill_rows >= 1, "prefill_rows is {}; it must be at least 1", options.prefill_rows);
  const auto t0 = Clock::now();
  DecodeStep step;
  Rows rows;
  std::vector<int> ends_here;  // the sequences whose last prompt token is in this forward
  auto flush = [&] {
    forward(model, cache, rows, step, options.stage_link);
    for (int s : ends_here) choose(step, s, 0);
    out.prefill_tokens += static_cast<std::int64_t>(rows.tokens.size());
    rows = Rows();
    ends_here.clear();
  };
  for (int s = 0; s < S; ++s) {
    const auto& prompt = prompts[static_cast<std::size_t>(s)];
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      if (rows.last_row.empty()) rows.last_row.assign(static_cast<std::size_t>(S), 0);
      rows.add(prompt[i], s, length[static_cast<std::size_t>(s)]++);
      if (i + 1 == prompt.size()) ends_here.push_back(s);
      if (static_cast<int>(rows.tokens.size()) == options.prefill_rows) flush();
    }
  }
  if (!rows.tokens.empty()) flush();
  const auto t1 = Clock::now();
  out.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  // Decode: the last new token of every unfinished sequence, one row each.
  for (int produced = 1; produced < options.max_new_tokens; ++produced) {
    Rows next;
    next.last_row.assign(static_cast<std::size_t>(S), 0);
    for (int s = 0; s < S; ++s)
      if (!done[static_cast<std::size_t>(s)])
        next.add(out.tokens[static_cast<std::size_t>(s)].back(), s, length[static_cast<std::size_t>(s)]++);
    if (next.tokens.empty()) break;
    forward(model, cache, next, step, options.stage_link);
    for (int s = 0; s < S; ++s)
      if (!done[static_cast<std::size_t>(s)]) choose(step, s, produced);
    out.decode_tokens += static_cast<std::int64_t>(next.tokens.size());
  }
  out.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return out;
}

}  // namespace fsdpp
