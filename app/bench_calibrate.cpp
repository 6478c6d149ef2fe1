// fsdpp bench calibrate [deck.yaml ...] [key=value ...] [--quick] > machine.yaml: measure the machine at hand
// and write its description (the machine YAML of docs/performance-model.md) for `fsdpp plan --machine`.
// Launch it as the runs it should predict are launched (the same ranks per node, the same nodes): every figure
// is measured with all ranks busy at once, so ranks that share cores, memory or links are measured sharing them.
//   GEMM       the linear layers of each deck at its micro-batch (and --micro-batches, --tp), forward (out =
//              inp W^T), input gradient (dinp = dout W) and weight gradient (dW += dout^T inp), and attention's
//              two per-head products (T x T x head size, T x head size x T), in the deck's matmul precision: gemm_points, and per precision the curve peak * F / (F + half) fitted to them
//              (precisions no deck uses: fitted to a few of the same shapes).
//   kernels    fsdpp's own non-GEMM kernels across sizes, each in the bytes the model counts for it: time =
//              kernel_overhead + bytes / memory_bandwidth fitted to the norms forward and the AdamW update;
//              backward_bandwidth to the norms backward; optimizer_bandwidth to the gradient norm and AdamW step
//              together; per kernel family (gelu, swiglu, the attention softmax) forward and backward rates.
//   host link  a host <-> device copy (a memory copy on host builds): latency and bandwidth.
//   network    calibrate_collectives.cpp: every group layout of this world, per link class.
// Progress goes to stderr, the YAML to stdout (rank 0).
#include "calibrate.hpp"
#include "commands.hpp"

#include "fsdpp/nn/kernels/gelu.hpp"
#include "fsdpp/nn/kernels/layernorm.hpp"
#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/nn/kernels/softmax.hpp"
#include "fsdpp/nn/kernels/swiglu.hpp"
#include "fsdpp/optim/adamw.hpp"
#include "fsdpp/optim/grad_norm.hpp"
#include "fsdpp/optim/deck_optimizer.hpp"
#include "fsdpp/plan/machine.hpp"
#include "fsdpp/plan/step_cost.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/plan/memory_check.hpp"
#include "fsdpp/plan/memory_plan.hpp"
#include "fsdpp/version.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <memory>
#include <set>
#include <tuple>

namespace fsdpp::app {
namespace {

using calibrate::seconds_all_busy;

struct CalibrateOptions {
  std::vector<std::string> words;  // deck files, then key=value overrides applied to each
  std::vector<int> micro_batches, tps;
  bool quick = false;
  std::size_t max_bytes = 16u << 20;
  std::string name;
  double memory_gib = 0;
  // The sweep's repeats and the seconds a timed repeat lasts: --quick is the CI's short sweep.
  int repeats() const { return quick ? 3 : 5; }
  double target_s() const { return quick ? 0.0 : 0.05; }
  // Sweeps over all GEMM shapes, each shape's figure the median of its sweeps': a disturbance lasting seconds
  // (another process, a virtual machine's neighbour) then spoils one sweep's figures of the shapes it hits, not
  // every repeat of them. Measured here: 2-rank calibrations whose four 2048-row shapes came out at half speed.
  int gemm_sweeps() const { return 3; }
  int gemm_repeats() const { return quick ? 1 : 2; }  // per sweep
};

// A product as gemm<float> runs it: C (m, n) = op(A) (m, k) . op(B) (k, n).
struct GemmShape {
  GemmPrecision precision;
  int m, n, k;
  Trans ta, tb;
  bool cold = false;  // the deck's step does not fit in the last-level cache: its operands come from memory
  auto key() const { return std::make_tuple(int(precision), m, n, k, int(ta), int(tb), cold); }
  bool operator<(const GemmShape& o) const { return key() < o.key(); }
};

struct MeasuredGemm {
  GemmShape shape;
  double tflops;
};

// Rank 0 reports progress on stderr: stdout is the YAML.
template <class... Args> void progress(MPI_Comm world, fmt::format_string<Args...> f, Args&&... args) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  if (rank == 0) fmt::print(stderr, "calibrate: {}\n", fmt::format(f, std::forward<Args>(args)...));
}

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

// The linear layers (out, in) of one rank of a deck's model under tensor parallelism `tp`: column-parallel
// layers split their outputs, row-parallel ones their inputs, the LM head its vocabulary (nn/decoder_block.cpp,
// nn/causal_lm.cpp).
std::vector<std::pair<int, int>> linear_layers(const ModelConfig& m, int tp) {
  const int C = m.n_embd, hd = m.n_embd / m.n_head;
  std::vector<std::pair<int, int>> layers;
  if (m.arch == ModelArch::gpt2) {
    layers = {{3 * C / tp, C}, {C, C / tp}, {4 * C / tp, C}, {C, 4 * C / tp}};
  } else {
    const int F = m.ffn_hidden, kv = m.n_kv_head * hd;
    layers = {{C / tp, C}, {kv / tp, C}, {C, C / tp}, {F / tp, C}, {C, F / tp}};
  }
  layers.push_back({m.vocab_size / tp, C});
  return layers;
}

// The last-level cache's bytes (64 MiB where the system does not say; GPU builds: 0, no cache to speak of).
std::int64_t last_level_cache_bytes() {
#if defined(FSDPP_DEVICE_BUILD)
  return 0;
#else
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l3 > 0 ? l3 : l2 > 0 ? l2 : std::int64_t{64} << 20;
#endif
}

// Whether a training step of the deck on one rank touches more memory than the last-level cache holds (the
// planner's peak): then its GEMMs find their operands in memory, not in cache, and calibrate measures them so.
bool step_exceeds_cache(const Deck& d) {
  const std::int64_t cache = last_level_cache_bytes();
  if (cache == 0) return false;
  try {
    return plan_memory(d, d.mesh.tp).memory.total() > cache;
  } catch (const UsageError&) {
    return true;  // a deck this launch cannot plan: assume the larger case
  }
}

// Forward, input gradient and weight gradient of every linear layer of every deck at each micro-batch and tp.
std::set<GemmShape> deck_gemm_shapes(const std::vector<Deck>& decks, const CalibrateOptions& o) {
  std::set<GemmShape> shapes;
  for (const Deck& d : decks) {
    std::vector<int> mbs = o.micro_batches, tps = o.tps;
    mbs.push_back(d.train.micro_batch > 0 ? d.train.micro_batch : d.train.global_batch);
    tps.push_back(d.mesh.tp);
    const GemmPrecision p = resolved_gemm_precision(d);
    const bool cold = step_exceeds_cache(d);
    for (int mb : mbs)
      for (int tp : tps)
        for (auto [out, in] : linear_layers(d.model, tp)) {
          const int tokens = mb * d.model.context_length;
          shapes.insert({p, tokens, out, in, Trans::N, Trans::T, cold});  // out = inp W^T
          shapes.insert({p, tokens, in, out, Trans::N, Trans::N, cold});  // dinp = dout W
          shapes.insert({p, out, in, tokens, Trans::T, Trans::N, cold});  // dW += dout^T inp
        }
    // Attention's products per (sequence, head), as the model prices them: scores q k^T (T, T, head size) and
    // the weighted values p v (T, head size, T); their backward products have the same two shapes.
    const int T = d.model.context_length, hs = d.model.n_embd / d.model.n_head;
    shapes.insert({p, T, T, hs, Trans::N, Trans::T, cold});
    shapes.insert({p, T, hs, T, Trans::N, Trans::N, cold});
  }
  return shapes;
}

// A cold shape cycles through enough copies of its operands to fill twice the last-level cache, so that each
// call finds them in memory, as a step larger than the cache does.
MeasuredGemm measure_gemm(MPI_Comm world, const GemmShape& s, const CalibrateOptions& o) {
  const ScopedGemmPrecision scoped(s.precision);
  const std::size_t a_size = std::size_t(s.m) * s.k, b_size = std::size_t(s.k) * s.n, c_size = std::size_t(s.m) * s.n;
  const double set_bytes = sizeof(float) * double(a_size + b_size + c_size);
  const int sets = s.cold ? std::clamp(int(std::ceil(2.0 * last_level_cache_bytes() / set_bytes)), 1, 64) : 1;
  std::vector<View1<float>> a, b, c;
  for (int i = 0; i < sets; ++i) {
    a.push_back(uninitialized<float>("calibrate_a", a_size));
    b.push_back(uninitialized<float>("calibrate_b", b_size));
    c.push_back(uninitialized<float>("calibrate_c", c_size));
    Kokkos::deep_copy(a.back(), 0.5f);
    Kokkos::deep_copy(b.back(), 0.25f);
    Kokkos::deep_copy(c.back(), 0.0f);
  }
  const int lda = s.ta == Trans::N ? s.k : s.m, ldb = s.tb == Trans::N ? s.n : s.k;
  const float beta = s.ta == Trans::T ? 1.0f : 0.0f;  // weight gradients accumulate
  int next = 0;
  const double t = seconds_all_busy(
      world, o.gemm_repeats(), o.target_s(),
      [&] {
        const int i = next++ % sets;
        gemm<float>(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a[i].data(), lda, b[i].data(), ldb, beta, c[i].data(), s.n);
      },
      [] { Kokkos::fence(); });
  return {s, 2.0 * s.m * double(s.n) * s.k / t / 1e12};
}

// achieved = peak F / (F + half)  <=>  1 / achieved = 1 / peak + (half / peak) / F: a line in 1 / F.
GemmCurve fit_gemm_curve(const std::vector<MeasuredGemm>& points) {
  std::vector<double> x, y;
  for (const MeasuredGemm& p : points) {
    x.push_back(1.0 / (2.0 * p.shape.m * double(p.shape.n) * p.shape.k / 1e9));
    y.push_back(1.0 / p.tflops);
  }
  const calibrate::LineFit f = calibrate::fit_line_relative(x, y);
  if (f.intercept <= 0) {  // no rise to a plateau (host BLAS: small products run from cache): flat, at the
    double flop = 0, seconds = 0;  // FLOP-weighted throughput of all the products
    for (const MeasuredGemm& p : points) {
      const double fl = 2.0 * p.shape.m * double(p.shape.n) * p.shape.k;
      flop += fl, seconds += fl / (p.tflops * 1e12);
    }
    return {flop / seconds / 1e12, 0};
  }
  return {1.0 / f.intercept, std::max(0.0, f.slope / f.intercept)};
}

// The same products in a precision no deck uses, at a few shapes spread over the FLOP range: for its curve.
std::vector<GemmShape> curve_shapes(const std::set<GemmShape>& measured, GemmPrecision p, bool quick) {
  std::vector<GemmShape> all(measured.begin(), measured.end());
  auto flop = [](const GemmShape& s) { return double(s.m) * s.n * s.k; };
  std::sort(all.begin(), all.end(), [&](const GemmShape& a, const GemmShape& b) { return flop(a) < flop(b); });
  std::vector<GemmShape> pick;
  const int want = quick ? 2 : 4;
  for (int i = 0; i < want && !all.empty(); ++i) {
    GemmShape s = all[(all.size() - 1) * i / std::max(1, want - 1)];
    s.precision = p;
    if (pick.empty() || pick.back() < s || s < pick.back()) pick.push_back(s);
  }
  return pick;
}

struct KernelFit {
  double bandwidth_gbs = 0, overhead_us = 0;  // the norms forward and the optimizer update
  double backward_bandwidth_gbs = 0;          // the norms backward, at kBackwardBytesPerForwardByte x forward bytes
  double optimizer_bandwidth_gbs = 0;         // the gradient norm and AdamW, at optimizer_passes x 4 bytes
  std::map<std::string, KernelRate> families;  // gelu, swiglu, softmax
};

// Rows of C for the norms and activations, T x T score matrices for the softmax: the first deck's widths.
struct KernelShape {
  int C = 0, T = 0;
  std::vector<std::int64_t> sizes;  // values per kernel call
};

// One kernel series' points, a point per size: bytes and seconds per kernel call.
struct KernelSeries {
  std::vector<double> bytes, seconds;
  // Its rate: bytes over time at the activation sizes (all but the first, a few rows, which is there for the
  // per-kernel overhead; a slope fitted through it follows the launch costs of the small calls).
  double gbs() const {
    double b = 0, t = 0;
    for (std::size_t i = bytes.size() > 1 ? 1 : 0; i < bytes.size(); ++i) b += bytes[i], t += seconds[i];
    return t > 0 ? b / t / 1e9 : 0;
  }
};

// The machine's figures from the series: "rest" (the norms forward and the AdamW update) fitted to overhead +
// bytes / bandwidth; the others their rates.
KernelFit fit_kernels(std::map<std::string, KernelSeries>& series) {
  KernelFit fit;
  const calibrate::LineFit rest = calibrate::fit_line_relative(series["rest"].bytes, series["rest"].seconds);
  fit.bandwidth_gbs = rest.slope > 0 ? 1.0 / rest.slope / 1e9 : 0;
  fit.overhead_us = rest.intercept * 1e6;
  fit.backward_bandwidth_gbs = series["rest_backward"].gbs();
  fit.optimizer_bandwidth_gbs = series["optimizer"].gbs();
  for (const std::string& family : kernel_family_names())
    fit.families[family] = {series[family].gbs(), series[family + "_backward"].gbs()};
  return fit;
}

// fsdpp's own non-GEMM kernels over a few sizes, each with the bytes the performance model counts for it
// (step_cost.cpp; the families' per element in kernel_family_bytes_per_element; backward kernels
// kBackwardBytesPerForwardByte times their forward's), each series fitted to overhead + bytes / bandwidth.
KernelFit measure_kernels(MPI_Comm world, const KernelShape& shape, const CalibrateOptions& o) {
  std::map<std::string, KernelSeries> series;  // "rest", "rest_backward", "optimizer", "<family>", "<family>_backward"
  const double f = sizeof(float), back = kBackwardBytesPerForwardByte;
  const int C = shape.C, T = shape.T;
  for (std::int64_t E : shape.sizes) {
    const int N = static_cast<int>(E / C);
    const std::int64_t score_rows = std::max<std::int64_t>(1, E / T);
    auto x = uninitialized<float>("calibrate_x", E), y = uninitialized<float>("calibrate_y", E);
    auto dy = uninitialized<float>("calibrate_dy", E), dx = uninitialized<float>("calibrate_dx", E);
    auto u = uninitialized<float>("calibrate_u", E), du = uninitialized<float>("calibrate_du", E);
    auto scores = uninitialized<float>("calibrate_scores", score_rows * T);
    auto dscores = uninitialized<float>("calibrate_dscores", score_rows * T);
    auto w = uninitialized<float>("calibrate_w", C), b = uninitialized<float>("calibrate_b", C);
    auto dw = uninitialized<float>("calibrate_dw", C), db = uninitialized<float>("calibrate_db", C);
    auto mean = uninitialized<float>("calibrate_mean", N), rstd = uninitialized<float>("calibrate_rstd", N);
    for (const auto& v : {x, y, dy, dx, u, du, w, b, dw, db, mean, rstd, scores, dscores}) Kokkos::deep_copy(v, 0.5f);
    Parameter param("calibrate.weight", {E}, InitRule::zeros(), ParamRole::weight);
    param.adopt(uninitialized<float>("calibrate_param", E), uninitialized<float>("calibrate_grad", E));
    Kokkos::deep_copy(param.value(), 0.5f);
    Kokkos::deep_copy(param.grad(), 0.01f);
    AdamW adamw({&param}, AdamWConfig{});
    const std::vector<Parameter*> params{&param};
    struct Kernel {
      const char* name;
      const char* series;
      double bytes;
      std::function<void()> run;
    };
    const double scores_n = double(score_rows) * T;
    const auto per = [](const char* family) { return kernel_family_bytes_per_element(family); };
    const std::vector<Kernel> kernels = {
        {"layernorm_forward", "rest", f * (2.0 * E + 2.0 * N),
         [&] { kernels::layernorm_forward<float>(y, mean, rstd, x, w, b, N, C); }},
        {"rmsnorm_forward", "rest", f * (2.0 * E + N), [&] { kernels::rmsnorm_forward<float>(y, rstd, x, w, N, C, 1e-5); }},
        {"adamw_step", "rest", f * 7.0 * E, [&] { adamw.step(1e-6f); }},  // param, m, v read and written; grad read
        {"layernorm_backward", "rest_backward", back * f * (2.0 * E + 2.0 * N),
         [&] { kernels::layernorm_backward<float>(dx, dw, db, dy, x, w, mean, rstd, N, C); }},
        {"rmsnorm_backward", "rest_backward", back * f * (2.0 * E + N),
         [&] { kernels::rmsnorm_backward<float>(dx, dw, dy, x, w, rstd, N, C); }},
        {"gelu_forward", "gelu", per("gelu") * E, [&] { kernels::gelu_forward<float>(y, x, int(E)); }},
        {"gelu_backward", "gelu_backward", back * per("gelu") * E, [&] { kernels::gelu_backward<float>(dx, x, dy, int(E)); }},
        {"swiglu_forward", "swiglu", per("swiglu") * E, [&] { kernels::swiglu_forward<float>(y, x, u, E); }},
        {"swiglu_backward", "swiglu_backward", back * per("swiglu") * E,
         [&] { kernels::swiglu_backward<float>(dx, du, dy, x, u, E); }},
        {"softmax_forward", "softmax", per("softmax") * scores_n,
         [&] { kernels::attention_softmax_forward<float>(scores.data(), score_rows, T); }},
        {"softmax_backward", "softmax_backward", back * per("softmax") * scores_n,
         [&] { kernels::attention_softmax_backward<float>(dscores.data(), scores.data(), score_rows, T); }},
        {"grad_norm_and_adamw", "optimizer", f * optimizer_passes(OptimConfig{}) * E,
         [&] { grad_norm_squared_local(params), adamw.step(1e-6f); }},
    };
    // "rest" is a mix (one point per size: its bytes over its time, so that a kernel slower than its bytes say
    // weighs by the time it takes, as in a step), per kernel, so that the intercept is one kernel's overhead.
    std::map<std::string, std::pair<double, double>> mix;  // series -> bytes, seconds
    std::map<std::string, int> count;
    std::string rates;
    for (const Kernel& k : kernels) {
      const double t = seconds_all_busy(world, o.repeats(), o.target_s(), k.run, [] { Kokkos::fence(); });
      mix[k.series].first += k.bytes, mix[k.series].second += t, ++count[k.series];
      rates += fmt::format(" {} {:.3g}", k.name, k.bytes / t / 1e9);
    }
    progress(world, "  {} values, GB/s:{}", E, rates);
    for (const auto& [name, bt] : mix) {
      series[name].bytes.push_back(bt.first / count[name]);
      series[name].seconds.push_back(bt.second / count[name]);
    }
  }
  return fit_kernels(series);
}

// A few rows of the first deck (the per-kernel overhead), and the activations of the largest micro-batch of any
// deck, one and four C wide (an MLP's hidden layer): sizes that live in memory, not in cache, as training's do.
KernelShape kernel_sizes(const std::vector<Deck>& decks, const CalibrateOptions& o) {
  std::int64_t tokens = 0;
  for (const Deck& d : decks) {
    int mb = d.train.micro_batch > 0 ? d.train.micro_batch : d.train.global_batch;
    for (int extra : o.micro_batches) mb = std::max(mb, extra);
    tokens = std::max(tokens, std::int64_t(mb) * d.model.context_length);
  }
  const int C = decks.front().model.n_embd;
  return {C, decks.front().model.context_length, {std::int64_t(C) * 16, tokens * C, tokens * C * 4}};
}

// A host <-> device copy (on host builds, a copy between two host buffers): latency and bandwidth.
calibrate::LineFit measure_host_link(MPI_Comm world, const CalibrateOptions& o) {
  std::vector<double> bytes, seconds;
  for (std::size_t n : {std::size_t(1) << 8, std::size_t(1) << 16, std::size_t(1) << 22}) {
    View1<float> device = uninitialized<float>("calibrate_device", n);
    Kokkos::View<float*, Kokkos::HostSpace> host(Kokkos::view_alloc(Kokkos::WithoutInitializing, "calibrate_host"), n);
    Kokkos::deep_copy(device, 1.0f);
    Kokkos::deep_copy(host, 2.0f);
    bytes.push_back(double(n) * sizeof(float));
    seconds.push_back(seconds_all_busy(world, o.repeats(), o.target_s(), [&] { Kokkos::deep_copy(host, device); },
                                       [] { Kokkos::fence(); }));
  }
  return calibrate::fit_line_relative(bytes, seconds);
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

// Four significant digits: calibration noise is far above that.
double sig4(double x) {
  if (x == 0 || !std::isfinite(x)) return 0;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(std::fabs(x))));
  return std::round(x * scale) / scale;
}

// An unmeasured link class (one node has no inter-node groups; one rank, no groups at all): the measured class's
// figures, or with nothing measured the memory copy's, so that the file loads; `notes` says which.
LinkClass stand_in_class(const std::vector<calibrate::LinkClassFits>& measured, const LinkFigures& copy) {
  LinkClass c;
  c.ring = c.tree = copy;
  if (measured.empty()) return c;
  const calibrate::CollectiveFit& ar = measured.front().ops[2];
  c.ring = c.tree = {sig4(ar.latency_us), sig4(ar.busbw_gbs)};
  return c;
}

// The fitted collectives of one class. ring and tree are both the fitted all_reduce (the model uses `measured`,
// per operation; a reader of ring/tree alone is not misled).
LinkClass measured_class(const calibrate::LinkClassFits& fits) {
  LinkClass c;
  auto figures = [](const calibrate::CollectiveFit& f) { return LinkFigures{sig4(f.latency_us), sig4(f.busbw_gbs)}; };
  c.ring = c.tree = figures(fits.ops[2]);
  c.all_gather = figures(fits.ops[0]);
  c.reduce_scatter = figures(fits.ops[1]);
  c.all_reduce = figures(fits.ops[2]);
  const BesideCompute& slows = fits.beside_compute.slows;
  c.beside_compute = {sig4(slows.compute_slowdown), sig4(slows.collective_slowdown)};
  return c;
}

// The network of the machine file; appends to `notes` what was not measured.
void set_network(Machine& m, const std::vector<calibrate::LinkClassFits>& fits) {
  bool intra = false, inter = false;
  for (const auto& f : fits) {
    (f.link_class == "inter_node" ? m.inter_node : m.intra_node) = measured_class(f);
    (f.link_class == "inter_node" ? inter : intra) = true;
  }
  const LinkClass stand_in = stand_in_class(fits, m.host_link);
  if (!intra) m.intra_node = stand_in;
  if (!inter) m.inter_node = stand_in;
  const char* what = fits.empty() ? "the memory copy (host_link)" : "the other class";
  if (!intra || !inter)
    m.notes += fmt::format(" NOT MEASURED (this launch has no such groups): {}, written as {}'s figures; "
                           "calibrate as the runs to predict are launched.",
                           !intra && !inter ? "intra_node and inter_node" : !intra ? "intra_node" : "inter_node", what);
}

}  // namespace

namespace {

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
                     "GEMM shapes of {}. gemm_points: m, n, k of gemm(op(A) (m,k) . op(B) (k,n)): forward m = "
                     "tokens, n = out, k = in; input gradient m = tokens, n = in, k = out; weight gradient m = out, "
                     "n = in, k = tokens.",
                     FSDPP_VERSION, host, when, n, per_node,
                     blocks ? "" : " (ranks NOT placed in node blocks: r / devices_per_node is not their node)",
                     matmul_backend(), blas_threads(), names);
}

// GEMM: the decks' shapes in their precisions (gemm_points), and a curve per precision.
void calibrate_gemm(MPI_Comm world, const std::vector<Deck>& decks, const CalibrateOptions& o, Machine& m) {
  const std::set<GemmShape> shapes = deck_gemm_shapes(decks, o);
  int n = 1;
  MPI_Comm_size(world, &n);
  progress(world, "{} GEMM shapes of {} deck(s), all {} rank(s) at once", shapes.size(), decks.size(), n);
  std::map<GemmShape, std::vector<double>> sweeps;  // TFLOP/s of each sweep
  for (int sweep = 0; sweep < o.gemm_sweeps(); ++sweep) {
    progress(world, " sweep {} of {}", sweep + 1, o.gemm_sweeps());
    for (const GemmShape& s : shapes) sweeps[s].push_back(measure_gemm(world, s, o).tflops);
  }
  std::map<GemmPrecision, std::vector<MeasuredGemm>> by_precision;
  for (const auto& [s, tflops] : sweeps) {
    const MeasuredGemm p{s, median(tflops)};
    const auto [low, high] = std::minmax_element(tflops.begin(), tflops.end());
    progress(world, "  gemm {} m {} n {} k {}: {:.4g} TFLOP/s (sweeps {:.3g} to {:.3g})",
             gemm_precision_name(s.precision), s.m, s.n, s.k, p.tflops, *low, *high);
    by_precision[s.precision].push_back(p);
  }
  // The machine file knows no transposes: the products of one (precision, m, n, k) become one point, their
  // throughput over their summed time.
  std::map<std::tuple<GemmPrecision, int, int, int>, std::pair<int, double>> merged;  // count, seconds per FLOP
  for (const auto& [precision, points] : by_precision)
    for (const MeasuredGemm& p : points) {
      auto& [count, inverse] = merged[{precision, p.shape.m, p.shape.n, p.shape.k}];
      ++count, inverse += 1.0 / p.tflops;
    }
  for (const auto& [key, v] : merged) {
    const auto& [precision, mm, nn, kk] = key;
    m.gemm_points.push_back({std::string(gemm_precision_name(precision)), mm, nn, kk, sig4(v.first / v.second)});
  }
  for (GemmPrecision p : {GemmPrecision::f32, GemmPrecision::tf32, GemmPrecision::bf16})
    if (!by_precision.count(p))
      for (const GemmShape& s : curve_shapes(shapes, p, o.quick)) {
        by_precision[p].push_back(measure_gemm(world, s, o));
        progress(world, "  gemm {} m {} n {} k {} (for the curve): {:.4g} TFLOP/s", gemm_precision_name(p), s.m, s.n,
                 s.k, by_precision[p].back().tflops);
      }
  for (const auto& [p, points] : by_precision) {
    const GemmCurve c = fit_gemm_curve(points);
    (p == GemmPrecision::f32 ? m.f32 : p == GemmPrecision::tf32 ? m.tf32 : m.bf16) = {sig4(c.peak_tflops),
                                                                                        sig4(c.half_gflop)};
    progress(world, "  {} curve: peak {:.4g} TFLOP/s, half at {:.4g} GFLOP", gemm_precision_name(p), c.peak_tflops,
             c.half_gflop);
  }
}

void calibrate_network(MPI_Comm world, const std::vector<int>& node_of, const Deck& deck, const CalibrateOptions& o,
                       Machine& m) {
  calibrate::CollectiveOptions co;
  co.repeats = o.repeats();
  co.target_s = o.quick ? 0.005 : 0.02;
  co.backend = deck.comm.backend;
  co.overlap = deck.comm.overlap;
  for (std::size_t b = 16u << 10; b <= o.max_bytes; b *= o.quick ? 16 : 4) co.bytes.push_back(b);
  std::vector<calibrate::LinkClassFits> fits;
  if (node_of.size() > 1) {
    progress(world, "collectives: {} sizes, {} .. {} bytes", co.bytes.size(), co.bytes.front(), co.bytes.back());
    fits = calibrate::measure_collectives(world, node_of, co);
    for (const auto& c : fits)
      for (const auto& f : c.ops)
        progress(world, "  {} {}: {:.4g} us + bytes / {:.4g} GB/s (group sizes {}, {} points)", c.link_class, f.op,
                 f.latency_us, f.busbw_gbs, fmt::join(f.group_sizes, ","), f.points);
    for (const auto& c : fits)
      progress(world, "  {} beside compute: compute {:+.1f}%, collectives {:+.1f}%", c.link_class,
               100 * c.beside_compute.slows.compute_slowdown, 100 * c.beside_compute.slows.collective_slowdown);
  }
  set_network(m, fits);
}

int run_calibrate(Runtime& rt, const CalibrateOptions& o) {
  const MPI_Comm world = rt.world();
  const std::vector<Deck> decks = decks_of(world, o.words);
  const std::vector<int> node_of = calibrate::node_of_ranks(world);
  const auto [per_node, blocks] = ranks_per_node(node_of);
  const int nodes = *std::max_element(node_of.begin(), node_of.end()) + 1;
  Machine m;
  m.name = o.name.empty() ? fmt::format("calibrated-{}x{}", nodes, per_node) : o.name;
  m.source = "calibrated";
  m.notes = describe_launch(world, per_node, blocks, decks);
  m.devices_per_node = per_node;
  m.memory_gib = sig4(o.memory_gib > 0 ? o.memory_gib : memory_gib_per_rank(world));

  calibrate_gemm(world, decks, o, m);
  const KernelShape shape = kernel_sizes(decks, o);
  progress(world, "non-GEMM kernels (layernorm, rmsnorm, gelu, swiglu, softmax; forward and backward; the "
           "optimizer step) at {} sizes", shape.sizes.size());
  const KernelFit k = measure_kernels(world, shape, o);
  progress(world, "  norms forward {:.4g} GB/s, {:.4g} us per kernel; backward {:.4g} GB/s; optimizer {:.4g} GB/s",
           k.bandwidth_gbs, k.overhead_us, k.backward_bandwidth_gbs, k.optimizer_bandwidth_gbs);
  for (const auto& [family, rate] : k.families) {
    progress(world, "  {}: forward {:.4g} GB/s, backward {:.4g} GB/s", family, rate.forward_gbs, rate.backward_gbs);
    if (rate.forward_gbs > 0 && rate.backward_gbs > 0)
      m.kernels[family] = {sig4(rate.forward_gbs), sig4(rate.backward_gbs)};
  }
  m.memory_bandwidth_gbs = sig4(k.bandwidth_gbs);
  m.backward_bandwidth_gbs = sig4(k.backward_bandwidth_gbs);
  m.optimizer_bandwidth_gbs = sig4(k.optimizer_bandwidth_gbs);
  m.kernel_overhead_us = sig4(k.overhead_us);
  const calibrate::LineFit h = measure_host_link(world, o);
  m.host_link = {sig4(h.intercept * 1e6), sig4(h.slope > 0 ? 1 / h.slope / 1e9 : 0)};
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
  cli->add_option("decks_and_overrides", o->words, "deck.yaml files whose GEMM shapes to measure, then key=value "
                                                    "overrides applied to each (none: the embedded tiny deck)");
  cli->add_flag("--quick", o->quick, "A short sweep (seconds): fewer sizes and repeats, for CI");
  cli->add_option("--micro-batches", o->micro_batches, "Also measure the GEMMs at these micro-batches")
      ->delimiter(',')->check(CLI::PositiveNumber);
  cli->add_option("--tp", o->tps, "Also measure the GEMMs at these tensor-parallel degrees")
      ->delimiter(',')->check(CLI::PositiveNumber);
  cli->add_option("--max-bytes", o->max_bytes, "Largest collective buffer of the sweep (full buffer, bytes)")
      ->check(CLI::Range(std::size_t(65536), std::size_t(1) << 32))->capture_default_str();
  cli->add_option("--name", o->name, "The machine's name in the YAML (default calibrated-<nodes>x<ranks per node>)");
  cli->add_option("--memory-gib", o->memory_gib, "Memory per rank (default: what fsdpp train checks plans against: the GPU's free memory, or the node's available memory, over the ranks sharing it)")
      ->check(CLI::PositiveNumber);
  return {cli, [o](Runtime& rt) { return run_calibrate(rt, *o); }};
}

}  // namespace fsdpp::app
