#include "fsdpp/train/step_log.hpp"

#include "fsdpp/runtime/error.hpp"
#include "fsdpp/runtime/log.hpp"

#include <nlohmann/json.hpp>

namespace fsdpp {

StepLog::StepLog(bool speaks, const std::string& metrics_path, int header_every)
    : speaks_(speaks), header_every_(header_every) {
  if (!speaks_ || metrics_path.empty()) return;
  metrics_.open(metrics_path, std::ios::app);
  FSDPP_CHECK(metrics_.good(), "cannot open {} for appending; check run.output and its permissions", metrics_path);
}

void StepLog::write(const StepRecord& r) {
  if (!speaks_) return;
  // Mixture-of-experts runs add the load-balancing loss and the busiest expert's load (over the mean).
  const bool moe = r.aux_loss.has_value();
  // Pipeline runs add the step's bubble: the share of the micro-batches' time a rank waited for another stage.
  const bool pipeline = r.pipeline_bubble.has_value();
  if (rows_ == 0 || (header_every_ > 0 && rows_ % header_every_ == 0))
    Log::info("{:>8} {:>9} {:>9} {:>10} {:>9} {:>10} {:>6} {:>9} {:>8} {:>9}{}{}", "Step", "Loss", "ValLoss", "LR",
              "GradNorm", "Tok/s", "MFU", "ms/step", "CommMs", "MaxMiB",
              moe ? fmt::format(" {:>8} {:>7}", "AuxLoss", "MaxLoad") : "", pipeline ? fmt::format(" {:>7}", "Bubble") : "");
  ++rows_;
  const std::string val = r.val_loss ? fmt::format("{:.4f}", *r.val_loss) : "-";
  Log::info("{:>8} {:>9.4f} {:>9} {:>10.3e} {:>9.4f} {:>10.0f} {:>6.3f} {:>9.1f} {:>8.2f} {:>9.1f}{}{}", r.step, r.loss, val,
            r.lr, r.grad_norm, r.tokens_per_s, r.mfu, r.ms_per_step, r.exposed_comm_ms, r.max_peak_mem_bytes / 1048576.0,
            moe ? fmt::format(" {:>8.4f} {:>7.2f}", *r.aux_loss, r.expert_load.value_or(0)) : "",
            pipeline ? fmt::format(" {:>6.1f}%", 100 * *r.pipeline_bubble) : "");
  if (!metrics_.is_open()) return;
  nlohmann::json j = {{"step", r.step},           {"loss", r.loss},
                      {"lr", r.lr},               {"grad_norm", r.grad_norm},
                      {"tokens_per_s", r.tokens_per_s}, {"mfu", r.mfu},
                      {"ms_per_step", r.ms_per_step},   {"peak_mem_bytes", r.peak_mem_bytes},
                      {"max_peak_mem_bytes", r.max_peak_mem_bytes}, {"exposed_comm_ms", r.exposed_comm_ms}};
  if (r.val_loss) j["val_loss"] = *r.val_loss;
  if (r.predicted_ms_per_step) j["predicted_ms_per_step"] = *r.predicted_ms_per_step;
  if (r.aux_loss) j["aux_loss"] = *r.aux_loss;
  if (r.expert_load) j["expert_load_max_over_mean"] = *r.expert_load;
  if (!r.expert_load_per_layer.empty()) j["expert_load_per_layer"] = r.expert_load_per_layer;
  if (r.dropped) j["dropped_pairs"] = *r.dropped;
  if (r.pipeline_bubble) j["pipeline_bubble"] = *r.pipeline_bubble;
  metrics_ << j.dump() << '\n';
  metrics_.flush();  // a crashed run keeps every step it logged
}

}  // namespace fsdpp
