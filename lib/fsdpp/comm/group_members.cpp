#include "fsdpp/comm/group_members.hpp"

#include <numeric>

namespace fsdpp {

std::vector<int> world_ranks_of(MPI_Comm group) {
  int size = 0;
  MPI_Comm_size(group, &size);
  std::vector<int> mine(static_cast<std::size_t>(size)), world(static_cast<std::size_t>(size));
  std::iota(mine.begin(), mine.end(), 0);
  MPI_Group from = MPI_GROUP_NULL, to = MPI_GROUP_NULL;
  MPI_Comm_group(group, &from);
  MPI_Comm_group(MPI_COMM_WORLD, &to);
  MPI_Group_translate_ranks(from, size, mine.data(), to, world.data());
  MPI_Group_free(&from);
  MPI_Group_free(&to);
  return world;
}

}  // namespace fsdpp
