#pragma once
// The step table (LAMMPS thermo style: fixed-width columns, the header reprinted every so often) and its
// machine-readable twin, <run.output>/metrics.jsonl, one JSON object per logged step. Rank 0 writes both.
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

struct StepRecord {
  std::int64_t step = 0;          // 1-based: optimizer steps completed
  double loss = 0;
  std::optional<double> val_loss;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double mfu = 0;                 // achieved FLOP/s over the measured sgemm peak; 0 when unknown
  double ms_per_step = 0;
  std::int64_t peak_mem_bytes = 0;      // this rank (rank 0 writes the record)
  std::int64_t max_peak_mem_bytes = 0;  // the largest over all ranks
  double exposed_comm_ms = 0;           // per step: time compute waited on collectives
  std::optional<double> predicted_ms_per_step;  // run.machine set: fsdpp plan --machine's prediction
  std::optional<double> aux_loss, expert_load;  // mixture-of-experts models (StepResult)
  std::vector<double> expert_load_per_layer;
  std::optional<double> pipeline_bubble;  // mesh.pp > 1: the step's bubble, mean over ranks (StepResult)
  std::optional<std::int64_t> dropped;
};

class StepLog {
 public:
  // `metrics_path` empty: no metrics file. `header_every` 0: print the header once.
  StepLog(bool speaks, const std::string& metrics_path, int header_every);
  void write(const StepRecord& record);

 private:
  bool speaks_;
  int header_every_;
  int rows_ = 0;
  std::ofstream metrics_;
};

}  // namespace fsdpp
