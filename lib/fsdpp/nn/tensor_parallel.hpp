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
//
// Sequence parallelism (Korthikanti et al. 2022, mesh.tp_sequence_parallel): outside the tensor-parallel
// regions, each rank keeps only its 1/tp of the B*T token rows (contiguous: rank r holds rows [r*N/tp,
// (r+1)*N/tp)). A region is entered by an all-gather of its input (the "g" operator; a reduce-scatter of the
// gradient in backward) and left by a reduce-scatter of its partial outputs instead of the all-reduce (an
// all-gather of the gradient in backward). The norms then see only local rows, so their weight gradients are
// partial sums, all-reduced over tp once per backward of a block.
//
// Overlap (comm.overlap, Megatron's): in backward, the input gradient of a column-parallel region is complete
// once every dX GEMM of the region ran, and the weight-gradient GEMMs do not read it. So the region's reduction
// (or under sequence parallelism the all-gather of the next region's output gradient) is issued with an _async
// form, the dW GEMMs run, then wait() hands back what the blocking form returns. The same collectives (op, count,
// communicator, algorithm) in the same order: results and stats counts are the blocking ones. At most one such
// collective is in flight, and it is waited within the backward that issued it: the buffers it reads and writes
// are the blocks' shared scratch. Without overlap the _async forms run blocking and wait() only returns.
#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/nn/parameter.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

// What a step's tensor parallelism cost: every all-reduce over tp (tests check the counts against Megatron's
// formulas; benchmarks report the bytes).
struct TensorParallelStats {
  std::int64_t all_reduces = 0, all_gathers = 0, reduce_scatters = 0;
  std::int64_t bytes = 0;   // payload per rank, f32: the reduced buffer, the gathered output, the scattered input
  // Time the compute thread spent in tp collectives (exposed communication): the blocking ones whole, the
  // overlapped ones' issue (the fence before it) and wait.
  double seconds = 0.0;
};

// A tensor-parallel collective started by an _async form of TensorParallelGroup. Pass it to the group's wait()
// before reading `result` or touching the buffers the collective reads or writes.
struct TpPending {
  WorkHandle work;      // the collective; null when it ran blocking (comm.overlap false, tp 1)
  View1<float> result;  // what the blocking form returns
  bool open = false;    // issued and not yet waited
};

class TensorParallelGroup {
 public:
  TensorParallelGroup() = default;  // one rank: no tensor parallelism
  // `comm` may refuse to communicate (a planning mesh): the model is then only shaped, never run. `mesh_dim`:
  // the name of the mesh dimension the group is, which every placement it makes records.
  // `overlap` (comm.overlap): the _async forms start their collective and return; false: they run blocking.
  TensorParallelGroup(int ranks, int rank, Communicator* comm, bool sequence_parallel = false,
                      std::string mesh_dim = "tp", bool overlap = true);

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  bool active() const { return ranks_ > 1; }
  bool sequence_parallel() const { return sequence_parallel_; }
  bool overlap() const { return overlap_; }
  // Token rows this rank holds outside the tensor-parallel regions: N / tp under sequence parallelism, else N.
  int local_rows(int N) const { return sequence_parallel_ ? N / ranks_ : N; }
  // Elements [rank * count, (rank + 1) * count) of buf: this rank's block of a gathered or scattered buffer.
  View1<float> own_block(const View1<float>& buf, std::size_t count) const;
  TensorParallelPlacement shard(int dim, int blocks = 1) const { return {dim, ranks_, rank_, blocks, mesh_dim_}; }
  const std::string& mesh_dim() const { return mesh_dim_; }

  // buf[0, count) reduced over the tp ranks, in place (sum or max). Counted in stats().
  void all_reduce(const View1<float>& buf, std::size_t count, ReduceOp op);
  // buf holds tp blocks of `count`: this rank's own_block in, every rank's block out (in place).
  void all_gather(const View1<float>& buf, std::size_t count);
  // `full` (tp blocks of `count`) summed over tp; this rank's block of the sum into `local` (count).
  void reduce_scatter(const View1<float>& full, const View1<float>& local, std::size_t count);

  // The three moves of a Megatron block, the same for every model (C: the residual stream's width; N: the
  // micro-batch's token rows; with tp 1 they do nothing and hand back what they were given):
  //   Leaving a row-parallel layer: `partial` holds its (N,OC) partial products; the sums of this rank's rows go
  //   to `out` (Nl,OC) (without sequence parallelism `partial` is `out`, summed in place).
  void reduce_row_parallel(const View1<float>& partial, const View1<float>& out, int N, int OC);
  //   Backward, into a region: the (N,C) gradient from this rank's rows `local`, gathered in `buffer` (under
  //   sequence parallelism; otherwise `local` is already whole and is returned).
  View1<float> gather_rows(const View1<float>& local, const View1<float>& buffer, int N, int C);
  //   Backward, out of a region: the region input's gradient, (N,C) partial sums in `partial`: summed in place,
  //   or under sequence parallelism this rank's rows of the sums into `local` (returned).
  View1<float> reduce_region_gradient(const View1<float>& partial, const View1<float>& local, int N, int C);
  //   The same, started: `partial` (and `local`) belong to the collective until wait().
  TpPending reduce_region_gradient_async(const View1<float>& partial, const View1<float>& local, int N, int C);
  //   all_gather, started: `buf` belongs to the collective until wait(); the result is `buf`.
  TpPending all_gather_async(const View1<float>& buf, std::size_t count);
  //   Waits for a started collective (rethrowing its error) and returns its result.
  View1<float> wait(TpPending& pending);
  //   Sequence parallelism, the norms: gradients computed from this rank's rows only sit in consecutive slots of
  //   `partial`, one per parameter (of its length): summed over tp, then added to the parameters' gradients (which
  //   may hold earlier micro-batches' under accumulation, so the sum is taken first).
  void add_norm_gradients(const View1<float>& partial, const std::vector<Parameter*>& norms);
  //   Where the norms' gradients go in backward: slots first_slot, first_slot + 1, ... of `partial` under
  //   sequence parallelism, for add_norm_gradients; otherwise the gradients themselves.
  std::vector<View1<float>> norm_gradients(const std::vector<Parameter*>& norms, const View1<float>& partial,
                                           int first_slot) const;

  // The vocabulary: this rank's rows of a (V, C) embedding or LM head start at vocab_offset (torch.chunk).
  int vocab_offset(int V) const;
  // Vocabulary-parallel cross-entropy (kernels/vocab_parallel.hpp) over this rank's (N, Vl) logits: the row
  // max and the sums of exp reduced over tp through `stats` (3N), every rank's `losses` the same; with
  // `training`, the logits become d(loss)/d(logits) for `dloss`, d(objective)/d(loss[n]) of every row.
  void vocab_parallel_loss(const View1<float>& logits, const View1<float>& losses, const View1<float>& stats,
                           const View1<const std::int32_t>& targets, int N, int Vl, int V, float dloss,
                           bool training);

  const TensorParallelStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  template <class Op> void run(std::int64_t& counter, std::size_t bytes, const Op& op);
  template <class Start>
  TpPending start(std::int64_t& counter, std::size_t bytes, const View1<float>& result, const Start& begin);
  TpPending ran_blocking(const View1<float>& result);
  void check_none_in_flight(const char* what) const;

  int ranks_ = 1, rank_ = 0;
  bool sequence_parallel_ = false;
  bool overlap_ = true;
  int in_flight_ = 0;  // started and not yet waited (at most one)
  std::string mesh_dim_ = "tp";
  Communicator* comm_ = nullptr;
  TensorParallelStats stats_;
};

}  // namespace fsdpp
