#pragma once
// The model a deck's model.arch names, on meta (shapes and init rules, no storage): the one place that chooses
// the architecture. Training, the planner, generation and the checkpoint converters all build through it.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/language_model.hpp"

#include <memory>

namespace fsdpp {

std::unique_ptr<LanguageModel> make_model(const ModelConfig& m);
// The deck's model with what the deck's data asks of it (document masks): what training, evaluation and the
// planner build.
std::unique_ptr<LanguageModel> make_model(const Deck& deck);

}  // namespace fsdpp
