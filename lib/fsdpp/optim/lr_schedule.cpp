#include "fsdpp/optim/lr_schedule.hpp"

#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <cmath>

namespace fsdpp {

float LrSchedule::at(std::int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return static_cast<float>(static_cast<double>(lr) * static_cast<double>(step + 1) / static_cast<double>(warmup_steps));
  if (kind == constant) return lr;
  const std::int64_t span = total_steps - warmup_steps;
  const double r = span <= 0 ? 1.0 : std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  const double coeff = 0.5 * (1.0 + std::cos(3.14159265358979323846 * r));
  return static_cast<float>(min_lr + coeff * (static_cast<double>(lr) - min_lr));
}

void LrSchedule::validate() const {
  FSDPP_REQUIRE(lr >= 0.0f, "learning-rate schedule: lr must be >= 0, got {}", lr);
  FSDPP_REQUIRE(min_lr >= 0.0f, "learning-rate schedule: min_lr must be >= 0, got {}", min_lr);
  FSDPP_REQUIRE(warmup_steps >= 0, "learning-rate schedule: warmup_steps must be >= 0, got {}", warmup_steps);
  FSDPP_REQUIRE(total_steps >= 0, "learning-rate schedule: total_steps must be >= 0, got {}", total_steps);
  FSDPP_REQUIRE(kind != cosine || total_steps >= warmup_steps,
                "learning-rate schedule: cosine decay needs total_steps ({}) >= warmup_steps ({})", total_steps,
                warmup_steps);
}

}  // namespace fsdpp
