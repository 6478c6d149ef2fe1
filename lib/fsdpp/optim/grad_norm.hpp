#pragma once
// The global gradient norm and clipping, with torch.nn.utils.clip_grad_norm_'s semantics, for norm_type 2 and
// inf.
//
// Squares are summed in double, one deterministic Kokkos reduction per parameter, and the per-parameter sums
// are added on the host in parameter order: the result is identical run to run on a given execution space and
// thread count (Serial: always).
//
// Under FSDP each rank holds a shard of every gradient: pass the communicator over which the parameters are
// split as `sum_over` and the squared norms are summed over it. Do not pass a group over which the gradients
// are replicated (the data-parallel replicas of HSDP): each element would be counted once per replica.
#include "fsdpp/nn/parameter.hpp"

#include <vector>

namespace fsdpp {

class Communicator;

// torch's norm_type 2 and inf; l2_exact is 2 with the squares summed exactly in fixed point
// (tensor/fixed_point.hpp), so that the norm is the same bits however the gradients are sharded (train.reproducible).
enum class NormType { l2, inf, l2_exact };

// Sum over the parameters' local gradient storage of grad^2.
double grad_norm_squared_local(const std::vector<Parameter*>& params);

// sqrt of the squared norm summed over `sum_over` (every rank of it must call, with its own shards); local
// when `sum_over` is null. The all-reduce uses an f64 host buffer on MPI and an f64 device buffer on NCCL.
// For inf: the largest |grad| element, the maximum taken over `sum_over`.
// Under tensor parallelism (`tensor_parallel` not null): the squares of the parameters split over tp are also
// summed over tp, and the replicated ones are not (every tp rank holds the same values), so every element of
// every parameter is counted exactly once.
// Pipeline parallelism (`stages` not null: one rank of each stage, parallel/pipeline_parallel.hpp): every stage
// holds parameters of its own, and the norm is taken over all of them; `counted_elsewhere` (or null) is a
// parameter this stage holds that another stage counts (the last stage's copy of a tied embedding).
double global_grad_norm(const std::vector<Parameter*>& params, Communicator* sum_over = nullptr,
                        NormType type = NormType::l2, Communicator* tensor_parallel = nullptr,
                        Communicator* stages = nullptr, const Parameter* counted_elsewhere = nullptr);

// Scales every gradient by max_norm / (norm + 1e-6) when that factor is below 1, and returns the norm before
// clipping (what the training log reports). A non-finite norm leaves the gradients unchanged: the caller sees
// it in the return value and may skip the step. Throws UsageError unless max_norm > 0 (a deck's
// train.grad_clip = 0 means: do not call this; use global_grad_norm for the log).
double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm, Communicator* sum_over = nullptr,
                      NormType type = NormType::l2, Communicator* tensor_parallel = nullptr,
                      Communicator* stages = nullptr, const Parameter* counted_elsewhere = nullptr);

// grad *= factor for every parameter (one kernel per parameter); clip_grad_norm's scaling.
void scale_grads(const std::vector<Parameter*>& params, float factor);

}  // namespace fsdpp
