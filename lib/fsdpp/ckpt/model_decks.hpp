#pragma once
// Decks of models named on the command line, and model.from_hf: the one way every command reads a Hugging Face
// model folder's config.json (rank 0 reads, every rank maps the same text). All collective.
#include "fsdpp/config/deck.hpp"

#include <mpi.h>

#include <string>
#include <vector>

namespace fsdpp {

// parse_deck's reader of model.from_hf folders.
ModelSourceReader hf_folder_reader(MPI_Comm world);
// Whether `path` is a folder (a Hugging Face model folder), as rank 0 sees it.
bool is_model_folder_everywhere(MPI_Comm world, const std::string& path);
// The deck of a model named on the command line (generate, eval, ckpt): --deck's file when given, else a model
// folder's config.json (model.from_hf), else the deck an fsdpp checkpoint carries; then the overrides.
Deck model_deck(MPI_Comm world, const std::string& source, const std::string& deck_path,
                const std::vector<std::string>& overrides = {});

}  // namespace fsdpp
