#pragma once
// Tensor parallelism inside a model, Megatron-LM style (Shoeybi et al. 2019), on the mesh's `tp` dimension:
//   - column-parallel Linear (weight Shard(0)): each rank computes its slice of the output features; attention's
//     c_attn is split by heads, so q, k and v of a head stay on one rank (StridedShard(0, blocks=3));
//   - row-parallel Linear (weight Shard(1)): each rank multiplies its slice of the input features, and the
//     partial outputs are summed over tp (one all-reduce), then the replicated bias is added once;
//   - the "f" operator in front of a column-parallel Linear: identity forward, all-reduce of the input gradient
//     backward, because every rank's slice contributed to it;
//   - vocabulary-parallel embedding and cross-entropy (Shard(0) of wte and lm_head): each rank looks up and
//     scores only its rows of the vocabulary; the row max and the sum of exp are all-reduced, so no rank holds
//     B*T*V logits.
// Replicated parameters (norms, the row-parallel biases, wpe) get identical gradients on every tp rank, so
// fully_shard treats them as it always does; tensor-parallel ones are sharded again over dp_shard (2-D).
#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/nn/parameter.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>

namespace fsdpp {

// What a step's tensor parallelism cost: every all-reduce over tp (tests check the counts against Megatron's
// formulas; benchmarks report the bytes).
struct TensorParallelStats {
  std::int64_t all_reduces = 0;
  std::int64_t bytes = 0;   // payload per rank, f32
  double seconds = 0.0;     // blocking time in the all-reduces (exposed communication)
};

class TensorParallelGroup {
 public:
  TensorParallelGroup() = default;  // one rank: no tensor parallelism
  // `comm` may refuse to communicate (a planning mesh): the model is then only shaped, never run.
  TensorParallelGroup(int ranks, int rank, Communicator* comm);

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  bool active() const { return ranks_ > 1; }
  TensorParallelPlacement shard(int dim, int blocks = 1) const { return {dim, ranks_, rank_, blocks}; }

  // buf[0, count) reduced over the tp ranks, in place (sum or max). Counted in stats().
  void all_reduce(const View1<float>& buf, std::size_t count, ReduceOp op);

  const TensorParallelStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  int ranks_ = 1, rank_ = 0;
  Communicator* comm_ = nullptr;
  TensorParallelStats stats_;
};

}  // namespace fsdpp
