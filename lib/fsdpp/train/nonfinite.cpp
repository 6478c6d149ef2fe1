#include "fsdpp/train/nonfinite.hpp"

#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/offload.hpp"

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <climits>
#include <cstdio>

namespace fsdpp {

std::int64_t count_nonfinite(const Parameter& p, ParamTensor which) {
  const View1<float> view = which == ParamTensor::value ? p.value() : p.grad();
  const float* v = view.data();
  // Sharded: the first local_numel elements are real, the rest padding. Unsharded or whole: every element.
  const auto extent = static_cast<std::int64_t>(view.extent(0));
  const std::int64_t n = std::min<std::int64_t>(extent, p.is_sharded() ? p.local_numel() : extent);
  std::int64_t bad = 0;
  reduce_over_index(
      "fsdpp::count_nonfinite", p.host_resident(), n,
      KOKKOS_LAMBDA(const std::int64_t j, std::int64_t& acc) {
        const float a = v[j];
        // False for NaN (every comparison is) and for +-Inf; no isfinite needed on any backend.
        if (!(a >= -3.402823466e38f && a <= 3.402823466e38f)) ++acc;
      },
      bad);
  return bad;
}

std::optional<std::string> first_nonfinite(MPI_Comm comm, const std::vector<Parameter*>& params, ParamTensor which,
                                           int part) {
  // (part, index): under a pipeline the earliest stage's first such parameter; the rank holding it names it.
  constexpr int kPerPart = 1 << 20;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  struct {
    int key, rank;
  } mine{INT_MAX, rank}, first{INT_MAX, 0};
  for (std::size_t i = 0; i < params.size(); ++i)
    if (count_nonfinite(*params[i], which) > 0) {
      mine.key = part * kPerPart + static_cast<int>(i);
      break;
    }
  FSDPP_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_2INT, MPI_MINLOC, comm));
  if (first.key == INT_MAX) return std::nullopt;
  char name[512] = {0};
  if (rank == first.rank)
    std::snprintf(name, sizeof name, "%s", params[static_cast<std::size_t>(first.key % kPerPart)]->name().c_str());
  FSDPP_MPI_CHECK(MPI_Bcast(name, sizeof name, MPI_CHAR, first.rank, comm));
  return std::string(name);
}

}  // namespace fsdpp
