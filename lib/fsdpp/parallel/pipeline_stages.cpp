#include "fsdpp/parallel/pipeline_stages.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace fsdpp {

std::string StageSplit::ranges() const {
  std::string out;
  for (int s = 0; s < stages(); ++s)
    out += fmt::format("{}{}-{}", s ? " | " : "", first[s], first[s + 1] - 1);
  return out;
}

StageSplit split_stages(const LanguageModel::FlopsByPiece& flops, int stages, const std::vector<int>& split) {
  const int L = static_cast<int>(flops.blocks.size());
  FSDPP_REQUIRE(stages >= 1 && stages <= L, "pipeline: {} stages for {} blocks", stages, L);
  // prefix[i]: the FLOPs of blocks 0 .. i-1.
  std::vector<double> prefix(L + 1, 0.0);
  for (int i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + flops.blocks[i];
  // The cost of blocks i .. j-1 as stage s of S.
  auto cost = [&](int i, int j, int s) {
    return prefix[j] - prefix[i] + (s == 0 ? flops.before : 0.0) + (s == stages - 1 ? flops.after : 0.0);
  };
  StageSplit out;
  if (!split.empty()) {
    FSDPP_REQUIRE(static_cast<int>(split.size()) == stages - 1, "pipeline.split: {} entries for {} stages",
                  split.size(), stages);
    out.first.push_back(0);
    out.first.insert(out.first.end(), split.begin(), split.end());
    out.first.push_back(L);
  } else {
    // best[s][j]: the smallest possible costliest stage when stages 0 .. s hold blocks 0 .. j-1; cut[s][j] the
    // first block of stage s there. Ties keep the earliest cut, so the split is the same on every rank.
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> best(stages, std::vector<double>(L + 1, inf));
    std::vector<std::vector<int>> cut(stages, std::vector<int>(L + 1, 0));
    for (int j = 1; j <= L; ++j) best[0][j] = cost(0, j, 0);
    for (int s = 1; s < stages; ++s)
      for (int j = s + 1; j <= L; ++j)
        for (int i = s; i < j; ++i) {
          const double worst = std::max(best[s - 1][i], cost(i, j, s));
          if (worst < best[s][j]) best[s][j] = worst, cut[s][j] = i;
        }
    out.first.assign(stages + 1, 0);
    out.first[stages] = L;
    for (int s = stages - 1, j = L; s > 0; --s) j = out.first[s] = cut[s][j];
  }
  for (int s = 0; s < stages; ++s) out.flops.push_back(cost(out.first[s], out.first[s + 1], s));
  return out;
}

PipelineStagePart pipeline_stage_part(const StageSplit& split, int pp, int rank) {
  FSDPP_CHECK(pp >= 1 && split.stages() % pp == 0 && rank >= 0 && rank < pp, "pipeline rank {} of {} over {} stages",
              rank, pp, split.stages());
  PipelineStagePart part;
  part.chunks.clear();
  for (int s = rank; s < split.stages(); s += pp) part.chunks.push_back({split.first[s], split.first[s + 1]});
  part.embedding = rank == 0;
  part.head = rank == pp - 1;
  return part;
}

}  // namespace fsdpp
