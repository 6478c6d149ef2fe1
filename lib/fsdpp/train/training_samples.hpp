#pragma once
// Samples while training, as llm.c prints them: every train.sample_interval steps, a greedy continuation of
// train.sample_prompt (train.sample_tokens new tokens) through the model as it is, logged by rank 0. Every rank
// runs the same generation (infer/generator.hpp): under fully_shard its forwards gather the parameters as
// evaluation does, under tensor parallelism each rank computes its heads; the root unit is resharded after.
#include "fsdpp/data/tokenizer.hpp"
#include "fsdpp/nn/language_model.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/parallel/pipeline_parallel.hpp"

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fsdpp {

struct Deck;

class TrainingSamples {
 public:
  // Collective: loads train.sample_tokenizer on every rank and encodes the prompt; a missing tokenizer, a prompt
  // that with its new tokens exceeds model.context_length, or ids past model.vocab_size is the same UsageError on
  // every rank, before the first step.
  TrainingSamples(MPI_Comm comm, LanguageModel& model, Parallelism& parallel, const Deck& deck);

  bool due(std::int64_t done) const { return interval_ > 0 && done % interval_ == 0; }
  // Collective: the continuation's text (the same on every rank).
  std::string run();
  // Under mesh.pp: every stage generates, each chunk's rows going from stage to stage (PipelineDecodeLink).
  void set_pipeline(PipelineParallel* pipeline) { pipeline_ = pipeline; }
  std::string heading(std::int64_t done) const;  // "---- sample at step 20: 32 tokens after "The" (greedy) ----"

 private:
  LanguageModel& model_;
  Parallelism& parallel_;
  PipelineParallel* pipeline_ = nullptr;
  std::int64_t interval_ = 0;
  int new_tokens_ = 0;
  std::string prompt_text_;
  std::vector<int> prompt_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace fsdpp
