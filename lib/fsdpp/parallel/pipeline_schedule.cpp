#include "fsdpp/parallel/pipeline_schedule.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

namespace fsdpp {
namespace {

std::tuple<int, int, int> key(PipelineOp op, int stage, int mb) { return {static_cast<int>(op), stage, mb}; }

PipelineAction F(int stage, int mb) { return {PipelineOp::forward, stage, mb}; }
PipelineAction B(int stage, int mb) { return {PipelineOp::backward, stage, mb}; }

// gpipe: all forwards in micro-batch order, then all backwards in the same order (torch's ScheduleGPipe).
PipelineSchedule gpipe(const PipelineShape& s) {
  PipelineSchedule out(s.ranks);
  for (int r = 0; r < s.ranks; ++r) {
    for (int i = 0; i < s.microbatches; ++i) out[r].push_back(F(r, i));
    for (int i = 0; i < s.microbatches; ++i) out[r].push_back(B(r, i));
  }
  return out;
}

// 1f1b (PipeDream-flush): rank r warms up with pp - 1 - r forwards, then alternates one forward and one
// backward, then drains the backwards.
PipelineSchedule one_f_one_b(const PipelineShape& s) {
  PipelineSchedule out(s.ranks);
  const int m = s.microbatches;
  for (int r = 0; r < s.ranks; ++r) {
    const int warmup = std::min(s.ranks - 1 - r, m);
    for (int i = 0; i < warmup; ++i) out[r].push_back(F(r, i));
    for (int i = 0; i + warmup < m; ++i) {
      out[r].push_back(F(r, i + warmup));
      out[r].push_back(B(r, i));
    }
    for (int i = m - warmup; i < m; ++i) out[r].push_back(B(r, i));
  }
  return out;
}

// interleaved_1f1b (Megatron-LM's schedules.py, forward_backward_pipelining_with_interleaving): the k-th forward
// of a rank runs its chunk (k mod pp v) / pp on micro-batch (k / (pp v)) pp + k mod pp; its k-th backward the
// chunks in reverse. Warm-up: 2 (pp - 1 - r) + (v - 1) pp forwards.
PipelineSchedule interleaved(const PipelineShape& s) {
  const int p = s.ranks, v = s.virtual_stages, total = s.microbatches * v;
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % (p * v)) / p;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  PipelineSchedule out(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(2 * (p - 1 - r) + (v - 1) * p, total);
    auto forward = [&](int k) { out[r].push_back(F(chunk_of(k, true) * p + r, microbatch_of(k))); };
    auto backward = [&](int k) { out[r].push_back(B(chunk_of(k, false) * p + r, microbatch_of(k))); };
    for (int k = 0; k < warmup; ++k) forward(k);
    for (int k = 0; k + warmup < total; ++k) {
      forward(k + warmup);
      backward(k);
    }
    for (int k = total - warmup; k < total; ++k) backward(k);
  }
  return out;
}

// What every replay shares: when each action's inputs arrive.
struct Replay {
  const PipelineShape& shape;
  const PipelineCosts& costs;
  std::map<std::tuple<int, int, int>, double> done;  // (op, stage, micro-batch) -> end time
  void record(const PipelineAction& a, double end) { done[key(a.op, a.stage, a.microbatch)] = end; }

  double cost(const PipelineAction& a) const {
    switch (a.op) {
      case PipelineOp::forward: return costs.forward[a.stage];
      case PipelineOp::backward: return costs.backward_input[a.stage] + costs.backward_weight[a.stage];
      case PipelineOp::backward_input: return costs.backward_input[a.stage];
      case PipelineOp::backward_weight: return costs.backward_weight[a.stage];
    }
    return 0;
  }
  const double* end_of(PipelineOp op, int stage, int mb) const {
    auto it = done.find(key(op, stage, mb));
    return it == done.end() ? nullptr : &it->second;
  }
  // The input gradient of (stage, mb): a whole backward or its input half, whichever the schedule runs.
  const double* input_grad_of(int stage, int mb) const {
    if (const double* t = end_of(PipelineOp::backward, stage, mb)) return t;
    return end_of(PipelineOp::backward_input, stage, mb);
  }
  // When `a` may start as far as its inputs go, or nullptr while one has not run; `waits` names it.
  std::optional<double> ready(const PipelineAction& a, PipelineAction& waits) const {
    const int S = shape.stages();
    const double hop = costs.p2p;
    auto across = [&](int other) { return shape.rank_of_stage(other) == shape.rank_of_stage(a.stage) ? 0.0 : hop; };
    switch (a.op) {
      case PipelineOp::forward:
        if (a.stage == 0) return 0.0;
        if (const double* t = end_of(PipelineOp::forward, a.stage - 1, a.microbatch)) return *t + across(a.stage - 1);
        waits = F(a.stage - 1, a.microbatch);
        return std::nullopt;
      case PipelineOp::backward:
      case PipelineOp::backward_input: {
        const double* own = end_of(PipelineOp::forward, a.stage, a.microbatch);
        if (!own) {
          waits = F(a.stage, a.microbatch);
          return std::nullopt;
        }
        if (a.stage == S - 1) return *own;
        if (const double* t = input_grad_of(a.stage + 1, a.microbatch)) return std::max(*own, *t + across(a.stage + 1));
        waits = B(a.stage + 1, a.microbatch);
        return std::nullopt;
      }
      case PipelineOp::backward_weight:
        if (const double* t = end_of(PipelineOp::backward_input, a.stage, a.microbatch)) return *t;
        waits = {PipelineOp::backward_input, a.stage, a.microbatch};
        return std::nullopt;
    }
    return std::nullopt;
  }
};

// zero_bubble (ZB-H1, Qi et al. 2023; the handcrafted order PaddlePaddle's pipeline_scheduler_ZBH1 runs):
// rank r warms up with pp - r forwards (one more than 1F1B), then runs r input gradients each followed by a
// forward with their weight gradients held back, then whole backwards and forwards in turn, then the remaining
// backwards; the r held-back weight gradients run last, where 1F1B would idle waiting for the backwards. Needs
// m >= pp (config/deck_rules.hpp's pipeline_microbatches says so to the deck).
PipelineSchedule zero_bubble(const PipelineShape& s) {
  const int p = s.ranks, m = s.microbatches;
  PipelineSchedule out(p);
  for (int r = 0; r < p; ++r) {
    auto& list = out[r];
    int f = 0, b = 0;
    for (; f < p - r; ++f) list.push_back(F(r, f));
    for (int k = 0; k < r; ++k) {
      list.push_back({PipelineOp::backward_input, r, b++});
      list.push_back(F(r, f++));
    }
    for (int k = 0; k < m - p; ++k) {
      list.push_back(B(r, b++));
      list.push_back(F(r, f++));
    }
    for (int k = 0; k < p - r - 1; ++k) list.push_back(B(r, b++));
    if (r > 0) {
      list.push_back({PipelineOp::backward_input, r, b});
      list.push_back({PipelineOp::backward_weight, r, b});
    } else {
      list.push_back(B(r, b));
    }
    for (int k = 0; k < r; ++k) list.push_back({PipelineOp::backward_weight, r, k});
  }
  return out;
}

char op_letter(PipelineOp op) {
  switch (op) {
    case PipelineOp::forward: return 'F';
    case PipelineOp::backward: return 'B';
    case PipelineOp::backward_input: return 'I';
    case PipelineOp::backward_weight: return 'W';
  }
  return '?';
}

}  // namespace

std::string to_string(const PipelineAction& a) {
  return fmt::format("{}{}@s{}", op_letter(a.op), a.microbatch, a.stage);
}

std::optional<PipelineAction> parse_pipeline_action(const std::string& text) {
  const std::string letters = "FBIW";
  const std::size_t at = text.find("@s");
  if (text.size() < 4 || letters.find(text[0]) == std::string::npos || at == std::string::npos) return std::nullopt;
  auto number = [](const std::string& digits) -> std::optional<int> {
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return std::stoi(digits);
  };
  const auto mb = number(text.substr(1, at - 1)), stage = number(text.substr(at + 2));
  if (!mb || !stage) return std::nullopt;
  return PipelineAction{static_cast<PipelineOp>(letters.find(text[0])), *stage, *mb};
}

PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, const PipelineShape& shape) {
  FSDPP_REQUIRE(shape.ranks >= 1 && shape.virtual_stages >= 1 && shape.microbatches >= 1,
                "pipeline: pp {}, virtual stages {} and micro-batches {} must all be at least 1", shape.ranks,
                shape.virtual_stages, shape.microbatches);
  check_virtual_stages(kind, shape.virtual_stages);
  check_pipeline_microbatches(kind, shape.ranks, shape.microbatches, false);
  switch (kind) {
    case PipelineScheduleKind::gpipe: return gpipe(shape);
    case PipelineScheduleKind::one_f_one_b: return one_f_one_b(shape);
    case PipelineScheduleKind::interleaved_1f1b: return interleaved(shape);
    case PipelineScheduleKind::zero_bubble: return zero_bubble(shape);
  }
  return {};
}

PipelineCosts PipelineCosts::uniform(int stages, double f, double p2p) {
  return {std::vector<double>(stages, f), std::vector<double>(stages, f), std::vector<double>(stages, f), p2p};
}

double one_f_one_b_ideal_bubble(int ranks, int microbatches) {
  return static_cast<double>(ranks - 1) / static_cast<double>(microbatches + ranks - 1);
}

PipelineTimeline simulate_pipeline(const PipelineSchedule& schedule, const PipelineShape& shape,
                                   const PipelineCosts& costs) {
  const int p = shape.ranks, S = shape.stages(), m = shape.microbatches;
  FSDPP_REQUIRE(static_cast<int>(schedule.size()) == p, "pipeline schedule: {} lists for pp {}", schedule.size(), p);
  FSDPP_REQUIRE(static_cast<int>(costs.forward.size()) == S && static_cast<int>(costs.backward_input.size()) == S &&
                    static_cast<int>(costs.backward_weight.size()) == S,
                "pipeline costs: {} stages expected", S);
  // Every (stage, micro-batch) runs its forward once and its backward once (whole, or as I then W), on its rank.
  std::map<std::tuple<int, int, int>, int> seen;
  for (int r = 0; r < p; ++r)
    for (const PipelineAction& a : schedule[r]) {
      FSDPP_REQUIRE(a.stage >= 0 && a.stage < S && a.microbatch >= 0 && a.microbatch < m,
                    "pipeline schedule: rank {} lists {}, outside {} stages x {} micro-batches", r, to_string(a), S, m);
      FSDPP_REQUIRE(shape.rank_of_stage(a.stage) == r, "pipeline schedule: rank {} lists {}, a stage of rank {}", r,
                    to_string(a), shape.rank_of_stage(a.stage));
      FSDPP_REQUIRE(++seen[key(a.op, a.stage, a.microbatch)] == 1,
                    "pipeline schedule: rank {} lists {} twice", r, to_string(a));
    }
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < m; ++i) {
      auto count = [&](PipelineOp op) { return seen.count(key(op, s, i)); };
      const bool whole = count(PipelineOp::backward) == 1;
      const bool split = count(PipelineOp::backward_input) == 1 && count(PipelineOp::backward_weight) == 1;
      FSDPP_REQUIRE(count(PipelineOp::forward) == 1 && whole != split,
                    "pipeline schedule: stage {} micro-batch {} lacks its forward or its backward (or has both a "
                    "whole and a split backward), on rank {}", s, i, shape.rank_of_stage(s));
    }

  Replay replay{shape, costs, {}};
  PipelineTimeline t;
  t.ranks.resize(p);
  t.peak_in_flight.assign(p, 0);
  std::vector<std::size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0);
  std::vector<int> in_flight(p, 0);
  std::size_t left = 0;
  for (const auto& list : schedule) left += list.size();
  while (left > 0) {
    // Of the ranks whose next action has its inputs, the one that can start it earliest goes next.
    int best = -1;
    double best_start = 0;
    for (int r = 0; r < p; ++r) {
      if (next[r] == schedule[r].size()) continue;
      PipelineAction waits;
      const std::optional<double> at = replay.ready(schedule[r][next[r]], waits);
      if (!at) continue;
      const double start = std::max(*at, free_at[r]);
      if (best < 0 || start < best_start) best = r, best_start = start;
    }
    if (best < 0) {
      std::string cycle;
      for (int r = 0; r < p; ++r) {
        if (next[r] == schedule[r].size()) continue;
        PipelineAction waits;
        (void)replay.ready(schedule[r][next[r]], waits);
        cycle += fmt::format("{}rank {} runs {} next and waits for {} (rank {})", cycle.empty() ? "" : "; ", r,
                             to_string(schedule[r][next[r]]), to_string(waits), shape.rank_of_stage(waits.stage));
      }
      throw UsageError(fmt::format("pipeline schedule for pp {}, {} virtual stage(s) and {} micro-batches would hang: "
                                   "{}", p, shape.virtual_stages, m, cycle));
    }
    const PipelineAction& a = schedule[best][next[best]];
    const double end = best_start + replay.cost(a);
    replay.record(a, end);
    t.ranks[best].push_back({a, best_start, end});
    t.busy += end - best_start;
    free_at[best] = end;
    if (a.op == PipelineOp::forward) t.peak_in_flight[best] = std::max(t.peak_in_flight[best], ++in_flight[best]);
    else if (a.op != PipelineOp::backward_input) --in_flight[best];
    ++next[best];
    --left;
  }
  for (int r = 0; r < p; ++r) t.makespan = std::max(t.makespan, free_at[r]);
  t.bubble = t.makespan > 0 ? 1.0 - t.busy / (p * t.makespan) : 0.0;
  return t;
}

std::string draw_pipeline(const PipelineTimeline& timeline, double unit) {
  std::vector<std::string> rows(timeline.ranks.size());
  std::size_t width = static_cast<std::size_t>(std::ceil(timeline.makespan / unit - 1e-9));
  for (std::size_t r = 0; r < timeline.ranks.size(); ++r) {
    std::vector<PipelineSlot> slots = timeline.ranks[r];
    std::stable_sort(slots.begin(), slots.end(),
                     [](const PipelineSlot& a, const PipelineSlot& b) { return a.start < b.start; });
    std::string& row = rows[r];
    // An action shorter than half a cell would round to its neighbour's cell and vanish under it (a traced
    // forward on the last stage often is): every action keeps at least one cell, after the cells of the one
    // before it. The next action then starts late on the cells it still has, and the row's time stays true.
    std::size_t drawn_to = 0;
    for (const PipelineSlot& slot : slots) {
      const int i = slot.action.microbatch;
      const char c = slot.action.op == PipelineOp::forward           ? static_cast<char>('0' + i % 10)
                     : slot.action.op == PipelineOp::backward_weight ? static_cast<char>('A' + i % 26)
                                                                     : static_cast<char>('a' + i % 26);
      const std::size_t from = std::max(drawn_to, static_cast<std::size_t>(std::lround(std::max(0.0, slot.start) / unit)));
      const std::size_t to = std::max(from + 1, static_cast<std::size_t>(std::lround(slot.end / unit)));
      if (row.size() < to) row.resize(to, '.');
      std::fill(row.begin() + static_cast<std::ptrdiff_t>(from), row.begin() + static_cast<std::ptrdiff_t>(to), c);
      drawn_to = to;
    }
    width = std::max(width, row.size());
  }
  std::string out;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    rows[r].resize(width, '.');
    out += fmt::format("rank {} |{}|\n", r, rows[r]);
  }
  return out;
}

}  // namespace fsdpp
