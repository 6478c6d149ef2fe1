#pragma once
// Text generation with a KV cache (nn/kv_cache.hpp): one prefill of every prompt as a ragged batch, then one
// token per unfinished sequence per decode step, each chosen by infer/sampling.hpp, until a stop token or
// max_new_tokens. Runs on any rank layout the model was built for: one rank; tensor parallelism over mesh.tp
// (every rank computes its heads and vocabulary rows and gets the whole logits); fully_shard (the training
// run's sampling: the forward passes gather parameters as evaluation does). Every rank returns the same tokens.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/infer/sampling.hpp"
#include "fsdpp/nn/causal_lm.hpp"

#include <cstdint>
#include <vector>

namespace fsdpp {

struct GenerationOptions {
  int max_new_tokens = 64;
  // The prefill runs the prompts' tokens in forwards of at most this many rows (in order, so each sees the keys
  // of the rows before it): its attention scores take rows x heads x cache positions, not the whole prompt's.
  int prefill_rows = 1024;
  Sampling sampling;
  std::vector<int> stop_tokens;  // generation of a sequence ends after it produces one of these (kept in its output)
  bool keep_prefill_logits = false;  // Generation::prefill_logits (fsdpp generate --logits)
  // A pipeline stage's link to the others (samples during training under mesh.pp); every stage then runs
  // generate() alike and chooses each token from the last stage's logits.
  DecodeStageLink* stage_link = nullptr;
};

struct Generation {
  std::vector<std::vector<int>> tokens;  // the new tokens of each prompt
  std::int64_t prefill_tokens = 0, decode_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;  // the first token comes with the prefill
  std::int64_t cache_bytes = 0;
  // With keep_prefill_logits: each prompt's next-token logits after its last token, (prompts, vocabulary), the
  // distribution its first new token is chosen from.
  std::vector<float> prefill_logits;
};

// The layout generation runs a deck's model on, whatever it was trained on: every one of `ranks` ranks one
// tensor-parallel rank of one replica (mesh.tp = ranks; full_shard over a data-parallel group of one, no sequence
// parallelism, no offload, reshard_after_forward auto: the training schedule's options do not apply).
Deck generation_layout(Deck deck, int ranks);

// What generating `sequences` of up to `capacity` tokens takes per rank, by category (fsdpp plan --generate).
struct GenerationMemory {
  std::int64_t parameters = 0;  // this rank's f32 weights (its tensor-parallel part)
  std::int64_t kv_cache = 0;
  std::int64_t decode_buffers = 0;  // the prefill's (every prompt token at once: the most rows)
  std::int64_t total() const { return parameters + kv_cache + decode_buffers; }
};
GenerationMemory plan_generation(const Deck& deck, int ranks, int sequences, int capacity,
                                 int prefill_rows = GenerationOptions{}.prefill_rows);

// UsageError naming the prompt when a prompt is empty, or its tokens plus max_new_tokens exceed the model's
// context; a token outside the vocabulary likewise.
Generation generate(CausalLM& model, const std::vector<std::vector<int>>& prompts, const GenerationOptions& options);

}  // namespace fsdpp
