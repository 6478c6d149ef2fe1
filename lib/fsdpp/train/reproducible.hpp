#pragma once
// Reproducible mode (train.reproducible, docs/reproducible.md): the parts that live outside fully_shard.
//
//   - the computation unit: a micro-batch runs as micro_batch / reproducible_unit units of reproducible_unit
//     sequences, one forward and backward each, so that a unit's gradient has the same shapes, and so the same
//     bits, on every layout (training_forward_batch, config/deck_rules.hpp, which DataFeed follows);
//   - the loss: the mean over the step's units of each unit's mean loss, summed exactly in fixed point
//     (ExactLossMean); the gradients' sum is fully_shard's exact reduction, the norm NormType::l2_exact.
//   - the BLAS threads: one per rank for the run (reproducible_blas_threads), whatever the environment.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/tensor/types.hpp"

#include <mpi.h>

#include <cstdint>
#include <string>

namespace fsdpp {

// Reproducible mode resuming a checkpoint saved on the mesh `saved_mesh` (DeviceMesh::describe, as the checkpoint
// records it): a UsageError when its tp degree differs from the deck's mesh.tp, since tensor parallelism changes
// the shapes of the products and the run could not continue bitwise. Nothing outside reproducible mode.
void check_reproducible_resume(const Deck& deck, const std::string& saved_mesh, const std::string& path);

// The run's BLAS threads per rank, for ScopedBlasThreads (tensor/matmul.hpp): 1 in reproducible mode, since
// OpenBLAS's products round differently on different thread counts, and by default 1 rank takes a node's cores and
// 2 ranks half each (configure_blas_threads); 0 (keep the count) otherwise.
int reproducible_blas_threads(const TrainConfig& train);
// The warning for the run banner when OPENBLAS_NUM_THREADS asks reproducible mode for another count than 1, which
// it overrides; "" when there is nothing to say.
std::string blas_threads_override(const TrainConfig& train);

// The exact sum of the units' losses over the job.
class ExactLossMean {
 public:
  void add(double unit_loss);  // one unit's mean loss, on this rank
  // Collective over `comm` (every rank of the job): the mean over `units` units of the losses added on every
  // rank, where each unit's loss was added on `copies` ranks (the tensor-parallel ranks of its data-parallel
  // rank). NaN when any was not finite. Resets the sum.
  double mean(MPI_Comm comm, std::int64_t units, int copies);
  // Token chunks (train.reproducible_chunks): every token's loss added on its own, wherever its rows ran (mesh.cp),
  // and the mean over every token added on every rank of the job (tp copies add each token alike).
  void add_each(const View1<const float>& token_losses);
  double mean_of_each(MPI_Comm comm);

 private:
  static constexpr int kWords = 3;             // LossWords::words (tensor/fixed_point.hpp)
  void cut_and_add(double value);
  // the words, the count of values that could not be cut, the count of values add_each added
  std::int64_t words_[kWords + 2] = {};
};

}  // namespace fsdpp
