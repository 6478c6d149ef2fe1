#include "fsdpp/train/training_samples.hpp"

#include "fsdpp/config/deck.hpp"
#include "fsdpp/infer/generator.hpp"
#include "fsdpp/parallel/pipeline_parallel.hpp"
#include "fsdpp/runtime/collective_errors.hpp"

#include <fmt/format.h>

#include <exception>
#include <optional>

namespace fsdpp {

TrainingSamples::TrainingSamples(MPI_Comm comm, LanguageModel& model, Parallelism& parallel, const Deck& deck)
    : model_(model), parallel_(parallel), interval_(deck.train.sample_interval),
      new_tokens_(deck.train.sample_tokens), prompt_text_(deck.train.sample_prompt) {
  if (interval_ == 0) return;
  std::string error;
  try {
    const std::string& path = deck.train.sample_tokenizer;
    tokenizer_ = path.empty() ? byte_level_tokenizer() : load_tokenizer(path);
    std::vector<std::uint32_t> ids;
    tokenizer_->encode(prompt_text_, prompt_text_.size(), true, ids);
    prompt_.assign(ids.begin(), ids.end());
    const std::int64_t length = static_cast<std::int64_t>(prompt_.size()) + new_tokens_;
    if (length > deck.model.context_length)
      error = fmt::format("train.sample_prompt is {} tokens ({}); with train.sample_tokens {} that is {}, more than "
                          "model.context_length {}: shorten the prompt or lower train.sample_tokens",
                          prompt_.size(), tokenizer_->describe(), new_tokens_, length, deck.model.context_length);
    else if (tokenizer_->vocab_size() > deck.model.vocab_size)
      error = fmt::format("train.sample_tokenizer: {} has {} ids, more than model.vocab_size {}: name the tokenizer "
                          "the training data was tokenized with", tokenizer_->describe(), tokenizer_->vocab_size(),
                          deck.model.vocab_size);
  } catch (const std::exception& e) {
    error = fmt::format("train.sample_tokenizer: {}", e.what());
  }
  agree_on_error(comm, error);
}

std::string TrainingSamples::run() {
  GenerationOptions options;  // greedy
  options.max_new_tokens = new_tokens_;
  std::optional<PipelineDecodeLink> link;
  if (pipeline_) options.stage_link = &link.emplace(*pipeline_);
  const Generation g = generate(dynamic_cast<CausalLM&>(model_), {prompt_}, options);
  parallel_.after_evaluation();  // the root unit, kept gathered after a forward for a backward, is resharded
  // A model whose vocabulary exceeds the tokenizer's (padded vocabularies, the byte-level default under a larger
  // model.vocab_size) may pick an id the tokenizer has no text for: shown as <id>, the run goes on.
  std::string text;
  std::vector<std::uint32_t> run;
  for (const int id : g.tokens[0]) {
    if (id < tokenizer_->vocab_size()) {
      run.push_back(static_cast<std::uint32_t>(id));
      continue;
    }
    text += tokenizer_->decode(run) + fmt::format("<{}>", id);
    run.clear();
  }
  return text + tokenizer_->decode(run);
}

std::string TrainingSamples::heading(std::int64_t done) const {
  return fmt::format("---- sample at step {}: {} tokens after \"{}\" (greedy) ----", done, new_tokens_, prompt_text_);
}

}  // namespace fsdpp
