#pragma once
// Where a NaN or an Inf is: the first parameter, in model order, whose values or gradients on some rank hold
// one. One small device reduction per parameter over this rank's storage (its shards under FSDP), then one
// all-reduce (the lowest index over the ranks), so every rank names the same parameter.
//
// TrainStep asks about gradients when a step's loss or gradient norm is not finite (train.on_nonfinite); the
// Checkpointer asks about values before it saves, so a checkpoint is never written from diverged weights.
#include "fsdpp/nn/parameter.hpp"

#include <mpi.h>

#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

enum class ParamTensor { value, grad };

// This rank's count of NaN and Inf elements in the real (unpadded) local storage of one parameter's tensor.
std::int64_t count_nonfinite(const Parameter& p, ParamTensor which);

// Collective over `comm`: the name of the first parameter of `params` (the same list, in the same order, on every
// rank of one `part`) that holds a NaN or an Inf on any rank; nullopt when every element everywhere is finite.
// Under a pipeline each stage is a part with its own list (`part`: the stage), and the earliest stage's wins.
std::optional<std::string> first_nonfinite(MPI_Comm comm, const std::vector<Parameter*>& params, ParamTensor which,
                                           int part = 0);

}  // namespace fsdpp
