#pragma once
// `fsdpp init`: the initial weights of a deck's model as a consolidated file (whole tensors), the same for any
// number of ranks or mesh (parallel/build_model.hpp fills every element from run.seed alike).
#include "fsdpp/config/deck.hpp"

#include <mpi.h>

#include <string>

namespace fsdpp {

// Collective; rank 0 writes `out`.
void write_seed_checkpoint(MPI_Comm comm, const Deck& deck, const std::string& out);

}  // namespace fsdpp
