// Calibration, the network half: each collective on every group layout a mesh of this world can have, across a
// size sweep, fitted per link class (plan/calibrate.hpp says what and why); and the measuring helpers every part
// of calibration shares.
#include "fsdpp/plan/calibrate.hpp"

#include "fsdpp/comm/make_communicator.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/runtime/median.hpp"
#include "fsdpp/tensor/matmul.hpp"
#include "fsdpp/tensor/types.hpp"

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>

namespace fsdpp {

double seconds_all_busy(MPI_Comm world, int repeats, double target_s, const std::function<void()>& run,
                        const std::function<void()>& finish) {
  using clock = std::chrono::steady_clock;
  run();  // warm-up: first touch, BLAS buffers, packing scratch, communicator set-up
  finish();
  MPI_Barrier(world);
  auto t0 = clock::now();
  run();
  finish();
  double once = std::chrono::duration<double>(clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, world);  // the same loop count everywhere
  const int loops = std::clamp(static_cast<int>(target_s / std::max(once, 1e-7)), 1, 10000);
  std::vector<double> mine;
  for (int r = 0; r < repeats; ++r) {
    MPI_Barrier(world);
    t0 = clock::now();
    for (int i = 0; i < loops; ++i) run();
    finish();
    mine.push_back(std::chrono::duration<double>(clock::now() - t0).count() / loops);
  }
  return median_over_ranks(world, median(mine));  // of two ranks their mean, not the slower: a step averages
}                                                 // its kernels' noise

void calibration_progress(MPI_Comm world, const std::string& line) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  if (rank == 0) fmt::print(stderr, "calibrate: {}\n", line);
}

double sig4(double x) {
  if (x == 0 || !std::isfinite(x)) return 0;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(std::fabs(x))));
  return std::round(x * scale) / scale;
}

double median_over_ranks(MPI_Comm world, double value) {
  int n = 1;
  MPI_Comm_size(world, &n);
  std::vector<double> all(n);
  MPI_Allgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, world);
  return median(all);
}

std::vector<int> node_of_ranks(MPI_Comm world) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0, n = 1;
  MPI_Get_processor_name(name, &len);
  MPI_Comm_size(world, &n);
  std::vector<char> all(static_cast<std::size_t>(n) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world);
  std::map<std::string, int> index;
  std::vector<int> node(n);
  for (int r = 0; r < n; ++r) {
    const std::string host(all.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    node[r] = index.emplace(host, static_cast<int>(index.size())).first->second;
  }
  return node;
}

namespace {

using clock = std::chrono::steady_clock;

// One group layout: `color` puts this rank in its group; the layout is measured only when every group in it
// is of one link class.
struct GroupLayout {
  int group_size;
  bool consecutive;
};

const char* const kOps[] = {"all_gather", "reduce_scatter", "all_reduce"};

// nccl-tests' bus-bandwidth factor: the fraction of the buffer each rank must send.
double bus_factor(int op, int g) { return (op == 2 ? 2.0 : 1.0) * (g - 1) / g; }

struct Point {
  int op, group_size;
  double bytes, seconds;
  // Groups of the layout crossing each node's links at once (the node's ranks over the group's ranks on it):
  // across nodes the fit is of the node's links, which these groups share, as the model prices them
  // (machine.cpp, collective_seconds: a group's share of the node).
  double groups_per_node_link;
};

// Seconds of one call of `op` at `bytes` (full buffer) on `comm`, slowest rank, median of repeats; every group of
// the layout runs at once. Collective over `world`.
double time_collective(MPI_Comm world, Communicator& comm, int op, std::size_t per_rank, View1<float>& send,
                       View1<float>& recv, const CollectiveOptions& o) {
  // As training issues it: with comm.overlap the asynchronous form (started, then waited for: the hand-off to
  // the communicator's thread included), else the blocking one.
  auto call = [&] {
    const std::size_t whole = per_rank * comm.size();
    if (o.overlap) {
      if (op == 0) comm.all_gather_async(send.data(), recv.data(), per_rank, DType::f32)->wait();
      else if (op == 1) comm.reduce_scatter_async(send.data(), recv.data(), per_rank, DType::f32)->wait();
      else comm.all_reduce_async(recv.data(), whole, DType::f32, ReduceOp::sum)->wait();
    } else if (op == 0) {
      comm.all_gather(send.data(), recv.data(), per_rank);
    } else if (op == 1) {
      comm.reduce_scatter(send.data(), recv.data(), per_rank);
    } else {
      comm.all_reduce(recv.data(), whole, ReduceOp::sum);
    }
  };
  call();
  Kokkos::fence();
  MPI_Barrier(world);
  auto t0 = clock::now();
  call();
  Kokkos::fence();
  double once = std::chrono::duration<double>(clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &once, 1, MPI_DOUBLE, MPI_MAX, world);
  if (once > o.max_call_s) return once;  // the caller ends the sweep; one call is figure enough
  const int loops = std::clamp(static_cast<int>(o.target_s / std::max(once, 1e-7)), 1, 10000);
  std::vector<double> t;
  for (int r = 0; r < o.repeats; ++r) {
    MPI_Barrier(world);
    t0 = clock::now();
    for (int i = 0; i < loops; ++i) call();
    Kokkos::fence();
    double s = std::chrono::duration<double>(clock::now() - t0).count() / loops;
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, world);
    t.push_back(s);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The node of each rank of `group`, in group order. Collective over `group`.
std::vector<int> group_nodes(MPI_Comm world, MPI_Comm group, const std::vector<int>& node_of) {
  int world_rank = 0, g = 1;
  MPI_Comm_rank(world, &world_rank);
  MPI_Comm_size(group, &g);
  std::vector<int> nodes(g);
  MPI_Allgather(&node_of[world_rank], 1, MPI_INT, nodes.data(), 1, MPI_INT, group);
  return nodes;
}

// -1: the layout's groups are of both classes (ranks not placed in node blocks); 0 intra-node; 1 inter-node.
int link_class_of(MPI_Comm world, const std::vector<int>& nodes) {
  int spans = std::any_of(nodes.begin(), nodes.end(), [&](int x) { return x != nodes[0]; }) ? 1 : 0;
  int lo = spans, hi = spans;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_INT, MPI_MIN, world);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_INT, MPI_MAX, world);
  return lo == hi ? lo : -1;
}

// The node's ranks over the group's ranks on this rank's node `mine`: how many of the layout's groups cross each
// node's links at once (ranks in node blocks: the same on every rank; the largest is taken). Collective over
// `world`.
double groups_per_node_link(MPI_Comm world, const std::vector<int>& nodes, const std::vector<int>& node_of, int mine) {
  double share = double(std::count(node_of.begin(), node_of.end(), mine)) /
                 double(std::count(nodes.begin(), nodes.end(), mine));
  MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_DOUBLE, MPI_MAX, world);
  return share;
}

// This rank's GEMMs while an all-gather of `per_rank` runs on the communicator's thread, as fully_shard's prefetch
// overlaps them: GEMMs are issued until the collective completes, `calls` collectives in a row. Against each
// alone: slowdown = (time per GEMM beside / alone) - 1, and the same per collective. The GEMM (192 x 192 x 192
// f32, a fraction of a millisecond on a core) is short beside a collective chosen to last tens of milliseconds,
// so it tracks the collective's end closely. Median of repeats, then over the ranks. Collective over `world`.
BesideComputeFit measure_beside_compute(MPI_Comm world, Communicator& comm, std::size_t per_rank, View1<float>& send,
                                        View1<float>& recv, const CollectiveOptions& o) {
  constexpr int n = 192;
  View1<float> a = uninitialized<float>("calibrate_beside_a", n * n), b = uninitialized<float>("calibrate_beside_b", n * n),
               c = uninitialized<float>("calibrate_beside_c", n * n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  auto one_gemm = [&] {
    gemm<float>(Trans::N, Trans::N, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    Kokkos::fence();
  };
  const double gemm_alone = seconds_all_busy(world, o.repeats, 4 * o.target_s, one_gemm, [] {});
  const double collective_alone = time_collective(world, comm, 0, per_rank, send, recv, o);
  const int calls = std::clamp(static_cast<int>(0.2 / std::max(collective_alone, 1e-6)), 1, 20);
  std::vector<double> compute_ratio, collective_ratio;
  for (int r = 0; r < o.repeats; ++r) {
    MPI_Barrier(world);
    const auto t0 = clock::now();
    long gemms = 0;
    for (int k = 0; k < calls; ++k) {
      WorkHandle h = comm.all_gather_async(send.data(), recv.data(), per_rank, DType::f32);
      while (!h->is_completed()) one_gemm(), ++gemms;
      h->wait();
    }
    const double wall = std::chrono::duration<double>(clock::now() - t0).count();
    collective_ratio.push_back(wall / calls / collective_alone);
    compute_ratio.push_back(wall / double(std::max(gemms, 1L)) / gemm_alone);
  }
  return {{std::max(0.0, median_over_ranks(world, median(compute_ratio)) - 1),
           std::max(0.0, median_over_ranks(world, median(collective_ratio)) - 1)},
          per_rank * comm.size() * sizeof(float)};
}

BesideComputeFit measure_layout(MPI_Comm world, MPI_Comm group, int g, double groups_per_node_link,
                                const CollectiveOptions& o, std::vector<Point>& points) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  const bool verbose = rank == 0;
  const CommBackend backend = choose_backend(o.backend);
  const std::unique_ptr<Communicator> comm = make_communicator(backend, group);
  const std::size_t most = *std::max_element(o.bytes.begin(), o.bytes.end()) / sizeof(float);
  View1<float> send = uninitialized<float>("calibrate_send", most), recv = uninitialized<float>("calibrate_recv", most);
  Kokkos::deep_copy(send, 1.0f);
  Kokkos::deep_copy(recv, 1.0f);
  for (int op = 0; op < 3; ++op) {
    for (std::size_t bytes : o.bytes) {
      const std::size_t per_rank = std::max<std::size_t>(1, bytes / sizeof(float) / g);
      const double s = time_collective(world, *comm, op, per_rank, send, recv, o);
      const double full = double(per_rank) * g * sizeof(float);
      points.push_back({op, g, full, s, groups_per_node_link});
      if (verbose)
        fmt::print(stderr, "calibrate:   {:<14} {:>10.0f} bytes {:>10.3f} ms\n", kOps[op], full, s * 1e3);
      if (s > o.max_call_s) break;
    }
  }
  // Beside compute: the largest all-gather of the sweep that lasts at most 0.1 s, through the communicator's
  // thread as training issues it (blocking collectives overlap nothing: 0).
  if (!o.overlap) return {};
  std::size_t chosen = 0;
  for (const Point& p : points)
    if (p.op == 0 && p.group_size == g && p.seconds <= 0.1) chosen = std::max(chosen, static_cast<std::size_t>(p.bytes));
  long long pick = static_cast<long long>(chosen);
  MPI_Allreduce(MPI_IN_PLACE, &pick, 1, MPI_LONG_LONG, MPI_MIN, world);  // every group measures at once, at one size
  if (pick <= 0) return {};
  const BesideComputeFit f = measure_beside_compute(world, *comm, std::max<std::size_t>(1, std::size_t(pick) / sizeof(float) / g),
                                                    send, recv, o);
  if (verbose)
    fmt::print(stderr, "calibrate:   beside compute ({} bytes all-gathered): compute {:+.1f}%, collective {:+.1f}%\n",
               f.bytes, 100 * f.slows.compute_slowdown, 100 * f.slows.collective_slowdown);
  return f;
}

}  // namespace

std::vector<LinkClassFits> measure_collectives(MPI_Comm world, const std::vector<int>& node_of,
                                               const CollectiveOptions& o) {
  int n = 1, rank = 0;
  MPI_Comm_size(world, &n);
  MPI_Comm_rank(world, &rank);
  std::vector<GroupLayout> layouts;
  for (int g = 2; g <= n; ++g)
    if (n % g == 0) {
      layouts.push_back({g, true});
      if (g < n) layouts.push_back({g, false});
    }
  std::map<int, std::vector<Point>> by_class;  // 0 intra, 1 inter
  std::map<int, BesideComputeFit> beside;      // per class: of its largest group (layouts come in growing size)
  std::map<std::pair<int, int>, bool> done;    // (group size, class) already measured
  for (const GroupLayout& l : layouts) {
    const int color = l.consecutive ? rank / l.group_size : rank % (n / l.group_size);
    MPI_Comm group;
    MPI_Comm_split(world, color, rank, &group);
    const std::vector<int> nodes = group_nodes(world, group, node_of);
    const int cls = link_class_of(world, nodes);
    const double sharing = groups_per_node_link(world, nodes, node_of, node_of[rank]);
    if (cls < 0) {
      fmt::print(stderr, "calibrate: groups of {} {} ranks mix intra- and inter-node groups (ranks are not placed "
                 "in node blocks); skipped\n", l.group_size, l.consecutive ? "consecutive" : "strided");
    } else if (!done[{l.group_size, cls}]) {
      done[{l.group_size, cls}] = true;
      if (rank == 0)
        fmt::print(stderr, "calibrate: collectives on groups of {} ({}, {} ranks{})\n", l.group_size,
                   cls ? "inter-node" : "intra-node", l.consecutive ? "consecutive" : "strided",
                   cls ? fmt::format("; {:g} group(s) at once over each node's links", sharing) : "");
      beside[cls] = measure_layout(world, group, l.group_size, cls == 1 ? sharing : 1.0, o, by_class[cls]);
    }
    MPI_Comm_free(&group);
  }
  std::vector<LinkClassFits> fits;
  for (const auto& [cls, points] : by_class) {
    LinkClassFits c{cls ? "inter_node" : "intra_node", {}, beside[cls]};
    for (int op = 0; op < 3; ++op) {
      std::vector<double> x, y;
      CollectiveFit f{kOps[op], 0, 0, 0, {}};
      for (const Point& p : points)
        if (p.op == op) {
          x.push_back(p.bytes * bus_factor(op, p.group_size) * p.groups_per_node_link);
          y.push_back(p.seconds);
          if (std::find(f.group_sizes.begin(), f.group_sizes.end(), p.group_size) == f.group_sizes.end())
            f.group_sizes.push_back(p.group_size);
        }
      const LineFit line = fit_line_relative(x, y);
      f.latency_us = line.intercept * 1e6;
      f.busbw_gbs = line.slope > 0 ? 1.0 / line.slope / 1e9 : 0;
      f.points = static_cast<int>(x.size());
      c.ops.push_back(f);
    }
    fits.push_back(c);
  }
  return fits;
}

namespace {

// An unmeasured link class (one node has no inter-node groups; one rank, no groups at all): the measured class's
// figures, or with nothing measured the memory copy's, so that the file loads; `notes` says which.
LinkClass stand_in_class(const std::vector<LinkClassFits>& measured, const LinkFigures& copy) {
  LinkClass c;
  c.ring = c.tree = copy;
  if (measured.empty()) return c;
  const CollectiveFit& ar = measured.front().ops[2];
  c.ring = c.tree = {sig4(ar.latency_us), sig4(ar.busbw_gbs)};
  return c;
}

// The fitted collectives of one class. ring and tree are both the fitted all_reduce (the model uses `measured`,
// per operation; a reader of ring/tree alone is not misled).
LinkClass measured_class(const LinkClassFits& fits) {
  LinkClass c;
  auto figures = [](const CollectiveFit& f) { return LinkFigures{sig4(f.latency_us), sig4(f.busbw_gbs)}; };
  c.ring = c.tree = figures(fits.ops[2]);
  c.all_gather = figures(fits.ops[0]);
  c.reduce_scatter = figures(fits.ops[1]);
  c.all_reduce = figures(fits.ops[2]);
  const BesideCompute& slows = fits.beside_compute.slows;
  c.beside_compute = {sig4(slows.compute_slowdown), sig4(slows.collective_slowdown)};
  return c;
}

}  // namespace

void set_network(Machine& m, const std::vector<LinkClassFits>& fits) {
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

}  // namespace fsdpp
