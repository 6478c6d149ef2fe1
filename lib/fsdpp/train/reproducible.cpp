#include "fsdpp/train/reproducible.hpp"

#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/fixed_point.hpp"

#include <regex>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace fsdpp {

static_assert(LossWords::words == 3, "ExactLossMean::kWords follows LossWords");

void check_reproducible_resume(const Deck& deck, const std::string& saved_mesh, const std::string& path) {
  if (!deck.train.reproducible) return;
  // "dp_shard=2 x tp=2 (4 ranks, mpi)": a mesh without a tp dimension ran at tp 1.
  std::smatch m;
  const int saved_tp = std::regex_search(saved_mesh, m, std::regex("(^| )tp=([0-9]+)")) ? std::stoi(m[2].str()) : 1;
  FSDPP_REQUIRE(saved_tp == deck.mesh.tp,
                "train.reproducible: checkpoint '{}' was saved at mesh.tp {} ({}), but this run has mesh.tp {}; "
                "tensor parallelism changes the shapes of the products, so the run would not continue bitwise. "
                "Resume with mesh.tp {} (any data-parallel layout), or set train.reproducible false",
                path, saved_tp, saved_mesh, deck.mesh.tp, saved_tp);
}

int reproducible_blas_threads(const TrainConfig& train) { return train.reproducible ? 1 : 0; }

std::string blas_threads_override(const TrainConfig& train) {
  const char* asked = std::getenv("OPENBLAS_NUM_THREADS");
  if (!train.reproducible || !asked || std::string(asked) == "1") return {};
  return fmt::format("train.reproducible runs OpenBLAS with 1 thread per rank, not OPENBLAS_NUM_THREADS={}: its "
                     "products round differently on other thread counts (docs/reproducible.md)", asked);
}

void ExactLossMean::cut_and_add(double value) {
  // |value| 2^24 must fit the top word; a loss beyond 2^30 (or NaN, Inf) is a diverged step: counted, not cut.
  if (!(std::fabs(value) < 1073741824.0)) {
    ++words_[kWords];
    return;
  }
  std::int64_t w[kWords];
  LossWords::cut(value, w);
  for (int j = 0; j < kWords; ++j) words_[j] += w[j];
}

void ExactLossMean::add(double unit_loss) { cut_and_add(unit_loss); }

void ExactLossMean::add_each(const View1<const float>& token_losses) {
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), token_losses);
  for (std::size_t i = 0; i < host.extent(0); ++i) cut_and_add(static_cast<double>(host(i)));
  words_[kWords + 1] += static_cast<std::int64_t>(host.extent(0));
}

double ExactLossMean::mean(MPI_Comm comm, std::int64_t units, int copies) {
  MPI_Allreduce(MPI_IN_PLACE, words_, kWords + 2, MPI_INT64_T, MPI_SUM, comm);
  const bool finite = words_[kWords] == 0;
  const double sum = LossWords::value(words_);
  for (auto& w : words_) w = 0;
  if (!finite) return std::numeric_limits<double>::quiet_NaN();
  return sum / static_cast<double>(units * copies);
}

double ExactLossMean::mean_of_each(MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, words_, kWords + 2, MPI_INT64_T, MPI_SUM, comm);
  const bool finite = words_[kWords] == 0;
  const double sum = LossWords::value(words_);
  const std::int64_t count = words_[kWords + 1];
  for (auto& w : words_) w = 0;
  if (!finite || count == 0) return std::numeric_limits<double>::quiet_NaN();
  return sum / static_cast<double>(count);
}

}  // namespace fsdpp
