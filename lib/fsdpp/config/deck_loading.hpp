#pragma once
// Decks as every command reads them: rank 0 reads the file, every rank receives its text (or the same error)
// and parses identical text, so N ranks do not hammer the file system and agree before any collective.
// model.from_hf folders are read through the caller's ModelSourceReader (ckpt/model_decks.hpp: hf_folder_reader).
#include "fsdpp/config/deck.hpp"

#include <mpi.h>

#include <string>
#include <vector>

namespace fsdpp {

// input/tiny.yaml at build time, so `fsdpp train` runs with nothing but the binary.
std::string embedded_tiny_deck();

// Rank 0 reads a deck file and every rank receives its text, or the same UsageError (collective).
std::string read_deck_everywhere(MPI_Comm world, const std::string& path);

// `[deck.yaml] [section.key=value ...]` -> the parsed deck; no file name: the embedded tiny deck. Collective.
Deck deck_from_words(MPI_Comm world, std::vector<std::string> words, const ModelSourceReader& from_hf);

}  // namespace fsdpp
