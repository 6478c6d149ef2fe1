#include "fsdpp/plan/machine.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace fsdpp {

// ---------------------------------------------------------------------------------------------------------
// Presets: spec-sheet figures. Peak FLOP/s are the dense (non-sparse) tensor-core figures; bus bandwidths are
// achievable ones, 80% of the link per direction (NCCL all-reduce on NVLink and on rail-optimized InfiniBand
// reaches about that); memory bandwidth is 85% of the HBM figure (streaming kernels).

namespace {

struct PresetFigures {
  const char* name;
  const char* notes;
  double memory_gib, hbm_gbs, f32, tf32, bf16, f32_half, tf32_half, bf16_half;
  double nvlink_gbs_per_direction, nic_gbs_per_node, pcie_gbs;
};

Machine preset_from(const PresetFigures& p) {
  Machine m;
  m.name = p.name;
  m.source = "spec-sheet";
  m.notes = p.notes;
  m.devices_per_node = 8;
  m.memory_gib = p.memory_gib;
  m.memory_bandwidth_gbs = 0.85 * p.hbm_gbs;
  m.kernel_overhead_us = 5;
  m.f32 = {p.f32, p.f32_half};
  m.tf32 = {p.tf32, p.tf32_half};
  m.bf16 = {p.bf16, p.bf16_half};
  m.host_link = {10, 0.8 * p.pcie_gbs};
  const double nvlink = 0.8 * p.nvlink_gbs_per_direction, ib = 0.8 * p.nic_gbs_per_node;
  m.intra_node.ring = {3, nvlink};
  m.intra_node.tree = {2, 0.85 * nvlink};
  m.inter_node.ring = {8, ib};
  m.inter_node.tree = {6, 0.9 * ib};
  return m;
}

const std::vector<PresetFigures>& presets() {
  static const std::vector<PresetFigures> table = {
      {"a100-sxm-8x",
       "NVIDIA A100 datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
       "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), DGX A100 user guide: 8x A100 SXM 80GB, dense FP32 19.5 / "
       "TF32 156 / BF16 312 TFLOP/s, HBM2e 2039 GB/s, NVLink3 600 GB/s (300 per direction), 8x 200 Gb/s HDR "
       "InfiniBand (200 GB/s per node), PCIe Gen4. Assumed: busbw 80% of link per direction, memory 85% of HBM, "
       "half_gflop an estimate of the GEMM size at half the peak (docs/performance-model.md)",
       80, 2039, 19.5, 156, 312, 0.25, 2, 4, 300, 200, 32},
      {"h100-sxm-8x",
       "NVIDIA H100 datasheet (resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet), DGX H100 "
       "user guide: 8x H100 SXM 80GB, dense FP32 67 / TF32 494.7 / BF16 989.4 TFLOP/s (the sheet's sparse figures "
       "halved), HBM3 3350 GB/s, NVLink4 900 GB/s (450 per direction), 8x 400 Gb/s NDR InfiniBand (400 GB/s per "
       "node), PCIe Gen5. Assumed: busbw 80% of link per direction, memory 85% of HBM, half_gflop an estimate "
       "(docs/performance-model.md)",
       80, 3350, 67, 494.7, 989.4, 1, 4, 8, 450, 400, 64},
      {"h200-sxm-8x",
       "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): 8x H200 SXM 141GB, dense FP32 67 / TF32 494.7 / "
       "BF16 989.4 TFLOP/s, HBM3e 4800 GB/s, NVLink4 900 GB/s (450 per direction), 8x 400 Gb/s NDR InfiniBand "
       "(as DGX H100), PCIe Gen5. Assumed: busbw 80% of link per direction, memory 85% of HBM, half_gflop an "
       "estimate (docs/performance-model.md)",
       141, 4800, 67, 494.7, 989.4, 1, 4, 8, 450, 400, 64},
  };
  return table;
}

}  // namespace

const std::vector<std::string>& machine_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const PresetFigures& p : presets()) out.push_back(p.name);
    return out;
  }();
  return names;
}

std::optional<Machine> machine_preset(const std::string& name) {
  for (const PresetFigures& p : presets())
    if (name == p.name) return preset_from(p);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------
// YAML

namespace {

// Walks a YAML map, refusing unknown keys and missing ones with the file, line and key, and what to write.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string where, std::string path)
      : node_(node), where_(std::move(where)), path_(std::move(path)) {
    FSDPP_REQUIRE(node_.IsMap(), "{}: '{}' must be a map of keys (see docs/performance-model.md, 'The machine YAML')",
                  at(node_), path_.empty() ? "the document" : path_);
  }
  std::string at(const YAML::Node& n) const { return fmt::format("{}:{}", where_, n.Mark().line + 1); }
  std::string key(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }
  bool has(const std::string& k) const { return static_cast<bool>(node_[k]); }
  YAML::Node child(const std::string& k) {
    seen_.insert(k);
    const YAML::Node n = node_[k];
    FSDPP_REQUIRE(n, "{}: '{}' has no key '{}'; add it (see docs/performance-model.md, 'The machine YAML')",
                  at(node_), path_.empty() ? "the document" : path_, key(k));
    return n;
  }
  double number(const std::string& k, bool positive = true) {
    const YAML::Node n = child(k);
    double v = 0;
    try {
      v = n.as<double>();
    } catch (const YAML::Exception&) {
      FSDPP_REQUIRE(false, "{}: {} is '{}'; write a number", at(n), key(k), n.Scalar());
    }
    FSDPP_REQUIRE(std::isfinite(v) && (positive ? v > 0 : v >= 0), "{}: {} is {}; write a {} number", at(n), key(k),
                  v, positive ? "positive" : "non-negative");
    return v;
  }
  std::string text(const std::string& k) {
    const YAML::Node n = child(k);
    FSDPP_REQUIRE(n.IsScalar(), "{}: {} must be a string", at(n), key(k));
    return n.Scalar();
  }
  MapReader map(const std::string& k) { return MapReader(child(k), where_, key(k)); }
  void done() const {
    for (const auto& kv : node_) {
      const std::string k = kv.first.Scalar();
      FSDPP_REQUIRE(seen_.count(k), "{}: unknown key '{}'; the keys here are {} (see docs/performance-model.md)",
                    at(kv.first), key(k), fmt::join(seen_, ", "));
    }
  }
  const YAML::Node& node() const { return node_; }

 private:
  YAML::Node node_;
  std::string where_, path_;
  std::set<std::string> seen_;
};

LinkFigures read_link(MapReader r) {
  LinkFigures f;
  f.latency_us = r.number("latency_us", false);
  f.busbw_gbs = r.number("busbw_gbs");
  r.done();
  return f;
}

LinkClass read_link_class(MapReader r) {
  LinkClass c;
  c.ring = read_link(r.map("ring"));
  c.tree = read_link(r.map("tree"));
  if (r.has("measured")) {
    MapReader m = r.map("measured");
    if (m.has("all_gather")) c.all_gather = read_link(m.map("all_gather"));
    if (m.has("reduce_scatter")) c.reduce_scatter = read_link(m.map("reduce_scatter"));
    if (m.has("all_reduce")) c.all_reduce = read_link(m.map("all_reduce"));
    m.done();
  }
  if (r.has("beside_compute")) {
    MapReader b = r.map("beside_compute");
    c.beside_compute.compute_slowdown = b.number("compute_slowdown", false);
    c.beside_compute.collective_slowdown = b.number("collective_slowdown", false);
    b.done();
  }
  r.done();
  return c;
}

GemmCurve read_curve(MapReader r) {
  GemmCurve g;
  g.peak_tflops = r.number("peak_tflops");
  g.half_gflop = r.number("half_gflop", false);
  r.done();
  return g;
}

// The device: memory, bandwidths, kernel families, BLAS threads, the GEMM curves and measured points.
void read_device(MapReader d, const std::string& where, Machine& m) {
  m.memory_gib = d.number("memory_gib");
  m.memory_bandwidth_gbs = d.number("memory_bandwidth_gbs");
  if (d.has("backward_bandwidth_gbs")) m.backward_bandwidth_gbs = d.number("backward_bandwidth_gbs");
  if (d.has("optimizer_bandwidth_gbs")) m.optimizer_bandwidth_gbs = d.number("optimizer_bandwidth_gbs");
  if (d.has("kernels")) {
    MapReader k = d.map("kernels");
    for (const auto& kv : k.node()) {
      const std::string family = kv.first.as<std::string>();
      const auto& names = kernel_family_names();
      FSDPP_REQUIRE(std::find(names.begin(), names.end(), family) != names.end(),
                    "{}: device.kernels.{} is not a kernel family the model prices; write one of {}",
                    k.at(kv.first), family, fmt::join(names, ", "));
      MapReader f = k.map(family);
      m.kernels[family] = {f.number("forward_gbs"), f.number("backward_gbs")};
      f.done();
    }
    k.done();
  }
  m.kernel_overhead_us = d.number("kernel_overhead_us", false);
  if (d.has("blas_threads_per_rank")) {
    const double threads = d.number("blas_threads_per_rank");
    FSDPP_REQUIRE(threads == std::floor(threads), "{}: device.blas_threads_per_rank is {}; write a whole number",
                  d.at(d.node()["blas_threads_per_rank"]), threads);
    m.blas_threads_per_rank = static_cast<int>(threads);
  }
  MapReader g = d.map("gemm");
  m.f32 = read_curve(g.map("f32"));
  m.tf32 = read_curve(g.map("tf32"));
  m.bf16 = read_curve(g.map("bf16"));
  g.done();
  if (d.has("gemm_points")) {
    const YAML::Node points = d.child("gemm_points");
    FSDPP_REQUIRE(points.IsSequence(), "{}: device.gemm_points must be a list of {{precision, m, n, k, tflops}}",
                  d.at(points));
    for (std::size_t i = 0; i < points.size(); ++i) {
      MapReader p(points[i], where, fmt::format("device.gemm_points[{}]", i));
      GemmPoint g2;
      g2.precision = p.text("precision");
      FSDPP_REQUIRE(g2.precision == "f32" || g2.precision == "tf32" || g2.precision == "bf16",
                    "{}: precision is '{}'; write f32, tf32 or bf16", p.at(points[i]), g2.precision);
      g2.m = static_cast<std::int64_t>(p.number("m"));
      g2.n = static_cast<std::int64_t>(p.number("n"));
      g2.k = static_cast<std::int64_t>(p.number("k"));
      g2.tflops = p.number("tflops");
      p.done();
      m.gemm_points.push_back(g2);
    }
  }
  d.done();
}

}  // namespace

Machine machine_from_yaml(const std::string& text, const std::string& where) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    FSDPP_REQUIRE(false, "{}:{}: not valid YAML: {}", where, e.mark.line + 1, e.msg);
  }
  MapReader r(root, where, "");
  Machine m;
  m.schema = static_cast<int>(r.number("fsdpp_machine"));
  FSDPP_REQUIRE(m.schema == 1, "{}: fsdpp_machine is {}; this fsdpp reads version 1", r.at(root), m.schema);
  m.name = r.text("name");
  m.source = r.text("source");
  m.notes = r.has("notes") ? r.text("notes") : "";
  const double per_node = r.number("devices_per_node");
  FSDPP_REQUIRE(per_node == std::floor(per_node), "{}: devices_per_node is {}; write a whole number",
                r.at(r.node()["devices_per_node"]), per_node);
  m.devices_per_node = static_cast<int>(per_node);
  read_device(r.map("device"), where, m);
  {
    MapReader h = r.map("host_link");
    m.host_link.busbw_gbs = h.number("bandwidth_gbs");
    m.host_link.latency_us = h.number("latency_us", false);
    h.done();
  }
  {
    MapReader n = r.map("network");
    m.intra_node = read_link_class(n.map("intra_node"));
    m.inter_node = read_link_class(n.map("inter_node"));
    n.done();
  }
  r.done();
  return m;
}

Machine load_machine(const std::string& preset_or_path, const std::string& what) {
  if (auto preset = machine_preset(preset_or_path)) return *preset;
  std::ifstream in(preset_or_path);
  FSDPP_REQUIRE(in.good(), "{} '{}' is neither a preset ({}) nor a readable file; name a preset, or write a "
                "file with `fsdpp bench calibrate > machine.yaml`", what, preset_or_path,
                fmt::join(machine_preset_names(), ", "));
  std::stringstream text;
  text << in.rdbuf();
  return machine_from_yaml(text.str(), preset_or_path);
}

namespace {

YAML::Node flow_map(std::initializer_list<std::pair<const char*, double>> kv) {
  YAML::Node n;
  for (const auto& [k, v] : kv) n[k] = v;
  n.SetStyle(YAML::EmitterStyle::Flow);
  return n;
}

YAML::Node link_node(const LinkFigures& f) { return flow_map({{"latency_us", f.latency_us}, {"busbw_gbs", f.busbw_gbs}}); }

YAML::Node link_class_node(const LinkClass& c) {
  YAML::Node n;
  n["ring"] = link_node(c.ring);
  n["tree"] = link_node(c.tree);
  if (c.all_gather || c.reduce_scatter || c.all_reduce) {
    YAML::Node measured;
    if (c.all_gather) measured["all_gather"] = link_node(*c.all_gather);
    if (c.reduce_scatter) measured["reduce_scatter"] = link_node(*c.reduce_scatter);
    if (c.all_reduce) measured["all_reduce"] = link_node(*c.all_reduce);
    n["measured"] = measured;
  }
  if (c.beside_compute.compute_slowdown > 0 || c.beside_compute.collective_slowdown > 0)
    n["beside_compute"] = flow_map({{"compute_slowdown", c.beside_compute.compute_slowdown},
                                    {"collective_slowdown", c.beside_compute.collective_slowdown}});
  return n;
}

}  // namespace

std::string to_yaml(const Machine& m) {
  YAML::Node root;
  root["fsdpp_machine"] = m.schema;
  root["name"] = m.name;
  root["source"] = m.source;
  root["notes"] = m.notes;
  root["devices_per_node"] = m.devices_per_node;
  YAML::Node device;
  device["memory_gib"] = m.memory_gib;
  device["memory_bandwidth_gbs"] = m.memory_bandwidth_gbs;
  if (m.backward_bandwidth_gbs > 0) device["backward_bandwidth_gbs"] = m.backward_bandwidth_gbs;
  if (m.optimizer_bandwidth_gbs > 0) device["optimizer_bandwidth_gbs"] = m.optimizer_bandwidth_gbs;
  for (const auto& [family, rate] : m.kernels)
    device["kernels"][family] = flow_map({{"forward_gbs", rate.forward_gbs}, {"backward_gbs", rate.backward_gbs}});
  device["kernel_overhead_us"] = m.kernel_overhead_us;
  if (m.blas_threads_per_rank > 0) device["blas_threads_per_rank"] = m.blas_threads_per_rank;
  YAML::Node gemm;
  gemm["f32"] = flow_map({{"peak_tflops", m.f32.peak_tflops}, {"half_gflop", m.f32.half_gflop}});
  gemm["tf32"] = flow_map({{"peak_tflops", m.tf32.peak_tflops}, {"half_gflop", m.tf32.half_gflop}});
  gemm["bf16"] = flow_map({{"peak_tflops", m.bf16.peak_tflops}, {"half_gflop", m.bf16.half_gflop}});
  device["gemm"] = gemm;
  if (!m.gemm_points.empty()) {
    YAML::Node points;
    for (const GemmPoint& p : m.gemm_points) {
      YAML::Node n;
      n["precision"] = p.precision;
      n["m"] = p.m;
      n["n"] = p.n;
      n["k"] = p.k;
      n["tflops"] = p.tflops;
      n.SetStyle(YAML::EmitterStyle::Flow);
      points.push_back(n);
    }
    device["gemm_points"] = points;
  }
  root["device"] = device;
  YAML::Node host;
  host["bandwidth_gbs"] = m.host_link.busbw_gbs;
  host["latency_us"] = m.host_link.latency_us;
  host.SetStyle(YAML::EmitterStyle::Flow);
  root["host_link"] = host;
  root["network"]["intra_node"] = link_class_node(m.intra_node);
  root["network"]["inter_node"] = link_class_node(m.inter_node);
  YAML::Emitter out;
  out.SetDoublePrecision(10);
  out << root;
  return std::string(out.c_str()) + "\n";
}

// ---------------------------------------------------------------------------------------------------------
// Costs

double collective_seconds(const LinkFigures& f, CollectiveOp op, std::int64_t bytes, int ranks, bool tree,
                          bool measured) {
  if (ranks <= 1) return 0;
  const double n = ranks;
  const bool reduce = op == CollectiveOp::all_reduce;
  const double factor = (reduce ? 2.0 : 1.0) * (n - 1) / n;  // nccl-tests' bus bandwidth
  double steps = reduce ? 2 * (n - 1) : n - 1;                 // ring
  if (tree && reduce) steps = 2 * std::ceil(std::log2(n));
  if (measured) steps = 1;  // the fitted intercept is the whole latency
  return f.latency_us * 1e-6 * steps + static_cast<double>(bytes) * factor / (f.busbw_gbs * 1e9);
}

double collective_seconds(const Machine& m, CollectiveOp op, std::int64_t bytes, int ranks, bool spans_nodes,
                          int per_node) {
  if (ranks <= 1) return 0;
  const LinkClass& c = spans_nodes ? m.inter_node : m.intra_node;
  // An all-to-all moves (n-1)/n of its payload off each rank, as an all-gather does of its output: priced with
  // the all-gather's figures (a ring's n-1 latency steps are an upper bound for its concurrent sends).
  const std::optional<LinkFigures>& measured =
      op == CollectiveOp::all_gather || op == CollectiveOp::all_to_all ? c.all_gather
      : op == CollectiveOp::reduce_scatter                             ? c.reduce_scatter
                                                                       : c.all_reduce;
  // Across nodes a group with fewer ranks on each node than the node has gets their share of the node's links:
  // the other ranks' groups cross the same links at the same time. Calibrate fits its measured figures per node
  // (calibrate_collectives.cpp), so the share applies to them as to ring and tree.
  const double share = spans_nodes && per_node > 0 && per_node < m.devices_per_node
                           ? static_cast<double>(per_node) / m.devices_per_node : 1.0;
  if (measured) {
    LinkFigures f = *measured;
    f.busbw_gbs *= share;
    return collective_seconds(f, op, bytes, ranks, false, true);
  }
  LinkFigures ring = c.ring, tree = c.tree;
  ring.busbw_gbs *= share;
  tree.busbw_gbs *= share;
  const double by_ring = collective_seconds(ring, op, bytes, ranks, false, false);
  if (op != CollectiveOp::all_reduce) return by_ring;
  return std::min(by_ring, collective_seconds(tree, op, bytes, ranks, true, false));  // NCCL picks the faster
}

double point_to_point_seconds(const Machine& m, std::int64_t bytes, bool spans_nodes, int per_node) {
  return collective_seconds(m, CollectiveOp::all_gather, 2 * bytes, 2, spans_nodes, per_node);
}

int group_ranks_per_node(const Machine& m, int stride, int ranks) {
  const int per_node = std::max(1, m.devices_per_node);
  return std::clamp(per_node / std::max(1, stride), 1, std::max(1, ranks));
}

bool group_spans_nodes(const Machine& m, int base, int stride, int ranks) {
  const int per_node = std::max(1, m.devices_per_node);
  return ranks > 1 && base / per_node != (base + stride * (ranks - 1)) / per_node;
}

const GemmCurve& gemm_curve(const Machine& m, const std::string& precision) {
  if (precision == "bf16") return m.bf16;
  if (precision == "tf32") return m.tf32;
  return m.f32;
}

namespace {

// A precision's gemm_points as a full grid: the distinct m, n, k values (ascending) and the TFLOP/s of each
// combination, m-major. None when the points are not one.
struct GemmGrid {
  std::vector<std::int64_t> m, n, k;
  std::vector<double> tflops;
};

std::vector<std::int64_t> distinct(std::vector<std::int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

std::size_t index_on(const std::vector<std::int64_t>& axis, std::int64_t x) {
  return static_cast<std::size_t>(std::lower_bound(axis.begin(), axis.end(), x) - axis.begin());
}

std::optional<GemmGrid> gemm_grid(const std::vector<GemmPoint>& points, const std::string& precision) {
  GemmGrid g;
  std::vector<const GemmPoint*> mine;
  for (const GemmPoint& p : points)
    if (p.precision == precision) mine.push_back(&p), g.m.push_back(p.m), g.n.push_back(p.n), g.k.push_back(p.k);
  g.m = distinct(g.m), g.n = distinct(g.n), g.k = distinct(g.k);
  const std::size_t cells = g.m.size() * g.n.size() * g.k.size();
  if (mine.empty() || mine.size() != cells) return std::nullopt;
  g.tflops.assign(cells, 0);
  for (const GemmPoint* p : mine) {
    double& cell = g.tflops[(index_on(g.m, p->m) * g.n.size() + index_on(g.n, p->n)) * g.k.size() + index_on(g.k, p->k)];
    if (cell > 0) return std::nullopt;  // a repeated point: some other combination is missing
    cell = p->tflops;
  }
  return g;
}

// Where x lies on an axis, in log: the lower neighbour's index and the weight of the upper one, x clamped to
// the axis' range.
std::pair<std::size_t, double> locate(const std::vector<std::int64_t>& axis, double x) {
  if (axis.size() == 1 || x <= double(axis.front())) return {0, 0.0};
  if (x >= double(axis.back())) return {axis.size() - 2, 1.0};
  const std::size_t hi = index_on(axis, static_cast<std::int64_t>(std::ceil(x)));
  const double lo_x = double(axis[hi - 1]), hi_x = double(axis[hi]);
  return {hi - 1, std::log(x / lo_x) / std::log(hi_x / lo_x)};
}

double interpolated_tflops(const GemmGrid& g, double m, double n, double k) {
  const auto [i, ti] = locate(g.m, m);
  const auto [j, tj] = locate(g.n, n);
  const auto [l, tl] = locate(g.k, k);
  double tflops = 0;
  for (int di = 0; di < 2; ++di)
    for (int dj = 0; dj < 2; ++dj)
      for (int dl = 0; dl < 2; ++dl) {
        const double w = (di ? ti : 1 - ti) * (dj ? tj : 1 - tj) * (dl ? tl : 1 - tl);
        if (w == 0) continue;  // also keeps a one-value axis from reading past its end
        tflops += w * g.tflops[((i + di) * g.n.size() + j + dj) * g.k.size() + l + dl];
      }
  return tflops;
}

// The point nearest in (log m, log n, log k); null when the precision has none.
const GemmPoint* nearest_point(const Machine& m, const std::string& precision, double rows, double cols,
                               double inner) {
  const GemmPoint* nearest = nullptr;
  double best = 0;
  for (const GemmPoint& p : m.gemm_points) {
    if (p.precision != precision) continue;
    const double d = std::pow(std::log(rows / p.m), 2) + std::pow(std::log(cols / p.n), 2) +
                     std::pow(std::log(inner / p.k), 2);
    if (!nearest || d < best) nearest = &p, best = d;
  }
  return nearest;
}

}  // namespace

double gemm_seconds(const Machine& m, const std::string& precision, std::int64_t rows, std::int64_t cols,
                    std::int64_t inner, std::int64_t count) {
  const double flops = 2.0 * static_cast<double>(rows) * static_cast<double>(cols) * static_cast<double>(inner);
  if (flops <= 0 || count <= 0) return 0;
  if (!m.gemm_points.empty()) {
    if (const std::optional<GemmGrid> grid = gemm_grid(m.gemm_points, precision))
      return count * flops / (interpolated_tflops(*grid, double(rows), double(cols), double(inner)) * 1e12);
    if (const GemmPoint* p = nearest_point(m, precision, double(rows), double(cols), double(inner)))
      return count * flops / (p->tflops * 1e12);
  }
  const GemmCurve& c = gemm_curve(m, precision);
  const double tflops = c.peak_tflops * flops / (flops + c.half_gflop * 1e9);
  return count * flops / (tflops * 1e12);
}

std::string blas_threads_mismatch(const Machine& m, int run_threads, const std::string& what) {
  if (m.blas_threads_per_rank <= 0 || run_threads <= 0 || m.blas_threads_per_rank == run_threads) return "";
  return fmt::format("{} '{}' was calibrated with {} BLAS thread(s) per rank (device.blas_threads_per_rank), but "
                     "the run uses {}: its GEMM rates do not hold here and the predicted time can be off by tens "
                     "of percent. Run with OPENBLAS_NUM_THREADS={} (as the calibration ran), or calibrate again "
                     "with the run's OPENBLAS_NUM_THREADS and ranks per node.",
                     what, m.name, m.blas_threads_per_rank, run_threads, m.blas_threads_per_rank);
}

double kernel_seconds(const Machine& m, double bytes) {
  return m.kernel_overhead_us * 1e-6 + bytes / (m.memory_bandwidth_gbs * 1e9);
}

const std::vector<std::string>& kernel_family_names() {
  static const std::vector<std::string> names = {"gelu", "swiglu", "softmax"};
  return names;
}

double kernel_family_bytes_per_element(const std::string& family) {
  if (family == "gelu") return 8;
  if (family == "swiglu" || family == "softmax") return 12;
  FSDPP_CHECK(false, "kernel_family_bytes_per_element: unknown family '{}'", family);
  return 0;
}

double elementwise_bandwidth_gbs(const Machine& m, bool backward, const std::string& family) {
  if (const auto it = m.kernels.find(family); it != m.kernels.end())
    return backward ? it->second.backward_gbs : it->second.forward_gbs;
  return backward && m.backward_bandwidth_gbs > 0 ? m.backward_bandwidth_gbs : m.memory_bandwidth_gbs;
}

double host_copy_seconds(const Machine& m, std::int64_t bytes) {
  return m.host_link.latency_us * 1e-6 + static_cast<double>(bytes) / (m.host_link.busbw_gbs * 1e9);
}

}  // namespace fsdpp
