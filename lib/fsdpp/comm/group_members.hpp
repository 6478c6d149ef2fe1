#pragma once
// The world ranks of a communicator's members, in its own rank order: what the flight recorder and the
// traffic counters name a group by. Local: no communication.
#include <mpi.h>

#include <vector>

namespace fsdpp {

std::vector<int> world_ranks_of(MPI_Comm group);

}  // namespace fsdpp
