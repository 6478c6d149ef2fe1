#pragma once
// Which bytes cross node boundaries, from fsdpp's own counters. Every communicator counts, for each collective
// it issues, the bytes a flat ring over its group (in group order) sends from this rank to the next one
// (ring_bytes_sent); at the end of a run the ranks add up, per mesh dimension, the bytes of the ring edges whose
// two ends are on different hosts. That is what the inter-node links must carry, payload only, when the
// collectives run as rings: fsdpp's own MPI rings (FSDPP_MPI_ALLGATHER=ring, reduce-scatter by default), NCCL's
// rings, and any algorithm on a group of two ranks. tests/cluster/ compares it with the bytes counted on the
// virtual nodes' links.
#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/comm/flight_recorder.hpp"

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// Bytes a flat ring sends from group rank `rank` to rank + 1 for one collective of `count` elements per rank on
// `ranks` ranks: all_gather and reduce_scatter (ranks - 1) blocks, all_reduce 2 (ranks - 1) / ranks of the
// buffer, broadcast the buffer unless the next rank is the root. fsdpp's MPI reduce-scatter ring passes f32
// partial sums after its first hop when reducing bf16 (mpi_algorithms.cpp), so those hops count 4 bytes.
std::uint64_t ring_bytes_sent(CollectiveOp op, std::size_t count, DType dtype, int ranks, int rank, int root,
                              CommBackend backend);

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
