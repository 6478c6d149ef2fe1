#pragma once
// One place that knows which backends this build has.
#include "fsdpp/comm/communicator.hpp"

#include <mpi.h>

#include <memory>

namespace fsdpp {

// Collective over `group`. NCCL: every member must call this in the same order for all groups it belongs to
// (DeviceMesh does, dimension by dimension), since ncclCommInitRank synchronises its members.
std::unique_ptr<Communicator> make_communicator(CommBackend backend, MPI_Comm group);

bool backend_available(CommBackend backend);  // compiled into this build (says nothing of GPUs present)

}  // namespace fsdpp
