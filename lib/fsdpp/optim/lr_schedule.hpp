#pragma once
// The learning rate of each step, llm.c's schedule:
//   warmup (step < warmup_steps):  lr * (step + 1) / warmup_steps   (the first step already trains)
//   constant:                      lr
//   cosine:                        min_lr + (lr - min_lr) * 0.5 (1 + cos(pi r)),
//                                  r = (step - warmup_steps) / (total_steps - warmup_steps), clamped to [0, 1]
// so cosine reaches min_lr at step total_steps and stays there. Steps count from 0.
#include <cstdint>

namespace fsdpp {

struct LrSchedule {
  enum Kind { constant, cosine };
  Kind kind = constant;
  float lr = 3e-4f, min_lr = 0.0f;
  std::int64_t warmup_steps = 0, total_steps = 0;

  float at(std::int64_t step) const;
  // Throws UsageError for negative rates or step counts, and for cosine when total_steps < warmup_steps.
  void validate() const;
};

}  // namespace fsdpp
