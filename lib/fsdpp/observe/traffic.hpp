#pragma once
// Which bytes cross node boundaries, from fsdpp's own counters. Every communicator counts, for each collective
// it issues, the bytes a flat ring over its group (in group order) sends from this rank to the next one
// (ring_bytes_sent, comm/communicator.hpp); at the end of a run the ranks add up, per mesh dimension, the bytes of the ring edges whose
// two ends are on different hosts. That is what the inter-node links must carry, payload only, when the
// collectives run as rings: fsdpp's own MPI rings (FSDPP_MPI_ALLGATHER=ring, reduce-scatter by default), NCCL's
// rings, and any algorithm on a group of two ranks. tests/cluster/ compares it with the bytes counted on the
// virtual nodes' links. An all_to_all (expert parallelism) sends each peer its block directly, not around a ring: it
// counts every byte that leaves the rank, attributed to the ring edge, so its crossing share is an estimate.
#include "fsdpp/observe/flight_recorder.hpp"

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

struct DimensionTraffic {
  std::string label;
  std::uint64_t collectives = 0;     // issued by one rank of each group
  double payload_bytes = 0;          // summed over the job's ranks
  double crossing_bytes = 0;         // ring bytes on edges between hosts, summed over the job
};

// Collective over `world`: the traffic of the communicators every rank registered, in registration order,
// added up by label. host_of_rank[r] names world rank r's host. Every rank gets the same table.
std::vector<DimensionTraffic> traffic_by_dimension(MPI_Comm world, const std::vector<std::string>& host_of_rank);

// The end-of-run table: one line per dimension, then the total bytes that crossed between nodes.
std::string format_traffic(const std::vector<DimensionTraffic>& traffic, const std::vector<std::string>& host_of_rank);

}  // namespace fsdpp
