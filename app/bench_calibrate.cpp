// fsdpp bench calibrate [deck.yaml ...] [key=value ...] [--quick] > machine.yaml: measure the machine at hand
// and write its description (the machine YAML of docs/performance-model.md) for `fsdpp plan --machine`.
// Launch it as the runs it should predict are launched (the same ranks per node, the same nodes, the same
// OPENBLAS_NUM_THREADS): every figure is measured with all ranks busy at once, so ranks that share cores, memory
// or links are measured sharing them. The measuring and fitting are the planner's (plan/calibrate.hpp); this file
// is the command: its options, which decks, the launch's description, the YAML.
//   GEMM       a fixed grid of shapes, independent of the decks, in the precisions the decks run
//   kernels    fsdpp's own non-GEMM kernels at the decks' widths and activation sizes
//   host link  a host <-> device copy (a memory copy on host builds)
//   network    every group layout of this world, per link class, through the first deck's comm.backend
// Progress goes to stderr, the YAML to stdout (rank 0).
#include "commands.hpp"

#include "fsdpp/ckpt/model_decks.hpp"
#include "fsdpp/config/deck_loading.hpp"
#include "fsdpp/plan/calibrate.hpp"
#include "fsdpp/plan/machine.hpp"
#include "fsdpp/plan/memory_check.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/version.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <memory>

namespace fsdpp::app {
namespace {

struct CalibrateOptions {
  std::vector<std::string> words;  // deck files, then key=value overrides applied to each
  std::vector<int> micro_batches;
  bool quick = false;
  std::size_t max_bytes = 16u << 20;
  std::string name;
  double memory_gib = 0;
};

// The decks named on the command line, each with every override (none named: the embedded tiny deck).
std::vector<Deck> decks_of(MPI_Comm world, const std::vector<std::string>& words) {
  std::vector<std::string> files, overrides;
  for (const std::string& w : words) (w.find('=') == std::string::npos ? files : overrides).push_back(w);
  if (files.empty()) files.push_back("");
  std::vector<Deck> decks;
  for (const std::string& f : files) {
    std::vector<std::string> d = overrides;
    if (!f.empty()) d.insert(d.begin(), f);
    decks.push_back(deck_from_words(world, d, hf_folder_reader(world)));
  }
  return decks;
}

// The first deck's widths, and the tokens of the largest micro-batch of any deck (and --micro-batches).
KernelShape kernel_shape_of(const std::vector<Deck>& decks, const CalibrateOptions& o) {
  std::int64_t tokens = 0;
  for (const Deck& d : decks) {
    int mb = d.train.micro_batch > 0 ? d.train.micro_batch : d.train.global_batch;
    for (int extra : o.micro_batches) mb = std::max(mb, extra);
    tokens = std::max(tokens, std::int64_t(mb) * d.model.context_length);
  }
  return kernel_shape(decks.front().model.n_embd, decks.front().model.context_length, tokens);
}

std::vector<GemmPrecision> precisions_of(const std::vector<Deck>& decks) {
  std::vector<GemmPrecision> out;
  for (const Deck& d : decks) out.push_back(resolved_gemm_precision(d));
  return out;
}

// Ranks on rank 0's node; the machine format says rank r is on node r / devices_per_node, so a launch that
// places ranks otherwise is described with that caveat in `notes`.
std::pair<int, bool> ranks_per_node(const std::vector<int>& node_of) {
  const int n = static_cast<int>(node_of.size());
  const int per = static_cast<int>(std::count(node_of.begin(), node_of.end(), node_of[0]));
  bool blocks = n % per == 0;
  for (int r = 0; r < n && blocks; ++r) blocks = node_of[r] == node_of[(r / per) * per];
  return {per, blocks};
}

// What `fsdpp train` checks a plan against (plan/memory_check.hpp): the node's available memory over its ranks,
// or the free memory of the rank's GPU over the ranks sharing it. Collective.
double memory_gib_per_rank(MPI_Comm world) {
  const std::optional<MemoryAvailable> m = memory_available_per_rank(world);
  FSDPP_REQUIRE(m.has_value(), "fsdpp bench calibrate: this system does not say how much memory a rank has (no "
                "/proc/meminfo); give it with --memory-gib");
  return m->bytes_per_rank / 1073741824.0;
}

std::string describe_launch(MPI_Comm world, int per_node, bool blocks, const std::vector<Deck>& decks) {
  int n = 1;
  MPI_Comm_size(world, &n);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  char when[32] = {};
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::string names;
  for (const Deck& d : decks) names += (names.empty() ? "" : ", ") + d.run.name;
  return fmt::format("fsdpp {} bench calibrate on {} at {}: {} rank(s), {} per node{}, {}, BLAS threads {}; "
                     "kernels and collectives of {}. gemm_points: the grid of m, n, k of gemm(op(A) (m,k) . op(B) "
                     "(k,n)), each the mean of a linear layer's three products (forward, input and weight "
                     "gradient).",
                     FSDPP_VERSION, host, when, n, per_node,
                     blocks ? "" : " (ranks NOT placed in node blocks: r / devices_per_node is not their node)",
                     matmul_backend(), blas_threads(), names);
}

void calibrate_network(MPI_Comm world, const std::vector<int>& node_of, const Deck& deck, const CalibrateOptions& o,
                       Machine& m) {
  const CalibrationEffort effort{o.quick};
  CollectiveOptions co;
  co.repeats = effort.repeats();
  co.target_s = o.quick ? 0.005 : 0.02;
  co.backend = deck.comm.backend;
  co.overlap = deck.comm.overlap;
  for (std::size_t b = 16u << 10; b <= o.max_bytes; b *= o.quick ? 16 : 4) co.bytes.push_back(b);
  std::vector<LinkClassFits> fits;
  if (node_of.size() > 1) {
    calibration_progress(world, fmt::format("collectives: {} sizes, {} .. {} bytes", co.bytes.size(),
                                            co.bytes.front(), co.bytes.back()));
    fits = measure_collectives(world, node_of, co);
    for (const auto& c : fits)
      for (const auto& f : c.ops)
        calibration_progress(world, fmt::format("  {} {}: {:.4g} us + bytes / {:.4g} GB/s (group sizes {}, {} "
                                                "points)", c.link_class, f.op, f.latency_us, f.busbw_gbs,
                                                fmt::join(f.group_sizes, ","), f.points));
    for (const auto& c : fits)
      calibration_progress(world, fmt::format("  {} beside compute: compute {:+.1f}%, collectives {:+.1f}%",
                                              c.link_class, 100 * c.beside_compute.slows.compute_slowdown,
                                              100 * c.beside_compute.slows.collective_slowdown));
  }
  set_network(m, fits);
}

int run_calibrate(Runtime& rt, const CalibrateOptions& o) {
  const MPI_Comm world = rt.world();
  const std::vector<Deck> decks = decks_of(world, o.words);
  const std::vector<int> node_of = node_of_ranks(world);
  const auto [per_node, blocks] = ranks_per_node(node_of);
  const int nodes = *std::max_element(node_of.begin(), node_of.end()) + 1;
  const CalibrationEffort effort{o.quick};
  Machine m;
  m.name = o.name.empty() ? fmt::format("calibrated-{}x{}", nodes, per_node) : o.name;
  m.source = "calibrated";
  m.notes = describe_launch(world, per_node, blocks, decks);
  m.devices_per_node = per_node;
  m.memory_gib = sig4(o.memory_gib > 0 ? o.memory_gib : memory_gib_per_rank(world));
  calibrate_gemm(world, precisions_of(decks), effort, m);
  calibrate_kernels(world, kernel_shape_of(decks, o), effort, m);
  calibrate_host_link(world, effort, m);
  calibrate_network(world, node_of, decks.front(), o, m);
  const std::string yaml = to_yaml(m);
  machine_from_yaml(yaml, "the calibrated machine");  // what plan --machine will read: refused here, not there
  if (rt.rank() == 0) std::fputs(yaml.c_str(), stdout);
  return 0;
}

}  // namespace

Command add_bench_calibrate_command(CLI::App& bench) {
  auto* cli = bench.add_subcommand("calibrate", "Measure this machine (GEMM, kernels, collectives) as the runs "
                                                "to predict are launched; the machine YAML on stdout");
  auto o = std::make_shared<CalibrateOptions>();
  cli->add_option("decks_and_overrides", o->words, "deck.yaml files whose GEMM precisions, kernel sizes and "
                                                    "communicator to measure, then key=value overrides applied to "
                                                    "each (none: the embedded tiny deck); the GEMM grid is the same "
                                                    "for every deck");
  cli->add_flag("--quick", o->quick, "A short sweep (seconds): fewer sizes and repeats, for CI");
  cli->add_option("--micro-batches", o->micro_batches, "Also size the non-GEMM kernels for these micro-batches")
      ->delimiter(',')->check(CLI::PositiveNumber);
  cli->add_option("--max-bytes", o->max_bytes, "Largest collective buffer of the sweep (full buffer, bytes)")
      ->check(CLI::Range(std::size_t(65536), std::size_t(1) << 32))->capture_default_str();
  cli->add_option("--name", o->name, "The machine's name in the YAML (default calibrated-<nodes>x<ranks per node>)");
  cli->add_option("--memory-gib", o->memory_gib, "Memory per rank (default: what fsdpp train checks plans against: the GPU's free memory, or the node's available memory, over the ranks sharing it)")
      ->check(CLI::PositiveNumber);
  return {cli, [o](Runtime& rt) { return run_calibrate(rt, *o); }};
}

}  // namespace fsdpp::app
