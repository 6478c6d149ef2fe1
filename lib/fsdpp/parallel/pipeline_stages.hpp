#pragma once
// Pipeline stages (mesh.pp): the model's L blocks cut into S = pp x pipeline.virtual_stages runs of consecutive
// blocks, the embedding with the first and the final norm, head and loss with the last. The cut is the deck's
// pipeline.split, or else the one that makes the costliest stage cheapest, by each block's FLOPs per token
// (LanguageModel::flops_per_token_by_piece, the MFU convention): on a small model the head weighs as much as a
// few blocks, so the last stage gets fewer.
#include "fsdpp/nn/language_model.hpp"

#include <string>
#include <vector>

namespace fsdpp {

struct StageSplit {
  std::vector<int> first;     // S + 1 entries: stage s holds blocks first[s] .. first[s + 1] - 1; first[S] = L
  std::vector<double> flops;  // per stage, per token: its blocks', plus the embedding's (first) and the head's (last)
  int stages() const { return static_cast<int>(flops.size()); }
  int blocks(int stage) const { return first[stage + 1] - first[stage]; }
  // "0-3 | 4-7 | 8-11"
  std::string ranges() const;
};

// `split`: the deck's pipeline.split (the first block of stages 1 .. S-1; config/deck_rules.hpp's check_pipeline
// has checked it), or empty for the balanced cut.
StageSplit split_stages(const LanguageModel::FlopsByPiece& flops, int stages, const std::vector<int>& split);

// What pipeline rank `rank` of `pp` keeps of a model cut by `split` into pp x v stages: the blocks of stages
// rank, rank + pp, ... (its chunks), the embedding on rank 0 and the head on rank pp - 1.
PipelineStagePart pipeline_stage_part(const StageSplit& split, int pp, int rank);

}  // namespace fsdpp
