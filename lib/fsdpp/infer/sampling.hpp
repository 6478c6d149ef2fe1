#pragma once
// Choosing the next token from a row of logits, as Hugging Face's generate() does: greedy (argmax, the first of
// equal maxima, as torch.argmax), or sampling after temperature, top-k and top-p (nucleus) in that order
// (transformers' TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper; ties at the top-k boundary are
// kept, and top-p keeps the smallest set of most probable tokens whose probability reaches top_p, at least one).
//
// The draw is counter-based (data/random.hpp's mix64): the uniform number of sequence s at step t depends only
// on (seed, s, t), so the same seed gives the same text whatever the batch, the ranks or the order of calls.
#include <cstdint>
#include <string>

namespace fsdpp {

struct Sampling {
  double temperature = 0.0;  // 0: greedy (do_sample=False); > 0: sample
  int top_k = 0;             // 0: off
  double top_p = 1.0;        // 1: off; (0, 1]
  std::uint64_t seed = 1337;

  bool greedy() const { return temperature <= 0.0; }
  void validate() const;        // UsageError naming the option (--temperature, --top-k, --top-p)
  std::string describe() const; // "greedy", "temperature 0.8, top-k 40, top-p 0.95, seed 7"
};

// The token chosen from logits[0, V) for sequence `sequence` at generation step `step`.
int sample_token(const float* logits, int V, const Sampling& sampling, std::int64_t sequence, std::int64_t step);

}  // namespace fsdpp
