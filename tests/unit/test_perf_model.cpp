// fsdpp plan --machine's model: the machine YAML (round trip, errors), the collective and GEMM formulas worked by
// hand, the event simulation on hand-built steps, and the plan's FLOPs against the trainer's MFU formula.
#include "input_decks.hpp"
#include "mpi_test.hpp"

#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/gpt.hpp"
#include "fsdpp/parallel/parallelize.hpp"
#include "fsdpp/optim/deck_optimizer.hpp"
#include "fsdpp/plan/machine.hpp"
#include "fsdpp/plan/simulate.hpp"
#include "fsdpp/plan/step_cost.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/parallel/build_model.hpp"

#include <cmath>
#include <map>
#include <set>

using namespace fsdpp;

namespace {

Machine sample_machine() {
  Machine m = *machine_preset("h100-sxm-8x");
  m.name = "sample";
  m.source = "calibrated";
  m.gemm_points.push_back({"bf16", 256, 768, 256, 0.09});
  m.intra_node.all_reduce = LinkFigures{50, 1.8};
  m.inter_node.beside_compute = {0.25, 0.5};
  m.backward_bandwidth_gbs = 4000;
  m.optimizer_bandwidth_gbs = 900;
  m.kernels["softmax"] = {1200, 6000};
  return m;
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

TimedOp compute(double s) { return {TimedOp::Kind::compute, s, "", -1, "forward", {}}; }
TimedOp issue(int id, double s, const std::string& stream = "dp_shard") { return {TimedOp::Kind::issue, s, stream, id, "", {}}; }
TimedOp wait(int id) { return {TimedOp::Kind::wait, 0, "", id, "", {}}; }
// A collective that slows compute by `c` while it runs and is slowed by `b` while compute runs.
TimedOp contended(int id, double s, double c, double b) { return {TimedOp::Kind::issue, s, "dp_shard", id, "", {c, b}}; }

}  // namespace

TEST_CASE("machine: every preset and a calibrated description survive to_yaml and back") {
  std::vector<Machine> machines;
  for (const std::string& name : machine_preset_names()) machines.push_back(*machine_preset(name));
  machines.push_back(sample_machine());
  CHECK(machine_preset_names().size() == 3);
  for (const Machine& m : machines) {
    CAPTURE(m.name);
    const std::string yaml = to_yaml(m);
    const Machine back = machine_from_yaml(yaml, "round-trip.yaml");
    CHECK(to_yaml(back) == yaml);
    CHECK(back.name == m.name);
    CHECK(back.devices_per_node == m.devices_per_node);
    CHECK(back.bf16.peak_tflops == doctest::Approx(m.bf16.peak_tflops));
    CHECK(back.inter_node.ring.busbw_gbs == doctest::Approx(m.inter_node.ring.busbw_gbs));
    CHECK(back.gemm_points.size() == m.gemm_points.size());
    CHECK(back.intra_node.all_reduce.has_value() == m.intra_node.all_reduce.has_value());
    CHECK(back.inter_node.beside_compute.compute_slowdown == m.inter_node.beside_compute.compute_slowdown);
    CHECK(back.inter_node.beside_compute.collective_slowdown == m.inter_node.beside_compute.collective_slowdown);
    CHECK(back.backward_bandwidth_gbs == m.backward_bandwidth_gbs);
    CHECK(back.optimizer_bandwidth_gbs == m.optimizer_bandwidth_gbs);
    CHECK(back.kernels.size() == m.kernels.size());
    for (const auto& [family, rate] : m.kernels) {
      CHECK(back.kernels.at(family).forward_gbs == rate.forward_gbs);
      CHECK(back.kernels.at(family).backward_gbs == rate.backward_gbs);
    }
  }
  // Without the pass bandwidths (the presets) they are absent from the YAML and every pass runs at
  // memory_bandwidth_gbs.
  const Machine h100 = *machine_preset("h100-sxm-8x");
  CHECK(to_yaml(h100).find("backward_bandwidth_gbs") == std::string::npos);
  CHECK(elementwise_bandwidth_gbs(h100, true) == h100.memory_bandwidth_gbs);
  CHECK(elementwise_bandwidth_gbs(sample_machine(), true) == 4000);
  CHECK(elementwise_bandwidth_gbs(sample_machine(), false) == sample_machine().memory_bandwidth_gbs);
  CHECK(elementwise_bandwidth_gbs(sample_machine(), false, "softmax") == 1200);
  CHECK(elementwise_bandwidth_gbs(sample_machine(), true, "softmax") == 6000);
  CHECK(elementwise_bandwidth_gbs(sample_machine(), true, "gelu") == 4000);  // no rate of its own: the pass's
  // Without beside_compute (the presets, files written before it) a class's slowdowns are 0.
  CHECK(to_yaml(*machine_preset("h100-sxm-8x")).find("beside_compute") == std::string::npos);
  CHECK(machine_preset("h100-sxm-8x")->inter_node.beside_compute.compute_slowdown == 0);
  // The presets are spec-sheet figures with their sheet named, dense peaks below the sparse ones' half + margin.
  for (const std::string& name : machine_preset_names()) {
    const Machine m = *machine_preset(name);
    CHECK(m.source == "spec-sheet");
    CHECK(m.notes.find("datasheet") != std::string::npos);
    CHECK(m.bf16.peak_tflops > m.tf32.peak_tflops);
    CHECK(m.tf32.peak_tflops > m.f32.peak_tflops);
    CHECK(m.intra_node.ring.busbw_gbs > m.inter_node.ring.busbw_gbs / 8);
  }
}

TEST_CASE("machine: YAML errors name the file, line and key, and say what to write") {
  const std::string good = to_yaml(*machine_preset("a100-sxm-8x"));
  CHECK_THROWS_WITH_AS(machine_from_yaml(replace(good, "  memory_bandwidth_gbs:", "  memory_bandwidth_gb:"), "m.yaml"),
                       doctest::Contains("device.memory_bandwidth_gbs"), UsageError);
  CHECK_THROWS_WITH_AS(machine_from_yaml(replace(good, "  kernel_overhead_us:", "  kernels:\n    relu: {forward_gbs: 1, backward_gbs: 2}\n  kernel_overhead_us:"), "m.yaml"),
                       doctest::Contains("device.kernels.relu is not a kernel family the model prices; write one of gelu, swiglu, softmax"),
                       UsageError);
  CHECK_THROWS_WITH_AS(machine_from_yaml(replace(good, "  kernel_overhead_us:", "  kernels:\n    gelu: {forward_gbs: 1}\n  kernel_overhead_us:"), "m.yaml"),
                       doctest::Contains("device.kernels.gelu.backward_gbs"), UsageError);
  CHECK_THROWS_WITH_AS(machine_from_yaml(replace(good, "devices_per_node: 8", "devices_per_node: eight"), "m.yaml"),
                       doctest::Contains("m.yaml:"), UsageError);
  CHECK_THROWS_WITH_AS(machine_from_yaml(replace(good, "devices_per_node: 8", "devices_per_node: eight"), "m.yaml"),
                       doctest::Contains("write a number"), UsageError);
  CHECK_THROWS_WITH_AS(machine_from_yaml(good + "extra: 1\n", "m.yaml"), doctest::Contains("unknown key 'extra'"),
                       UsageError);
  CHECK_THROWS_WITH_AS(machine_from_yaml(replace(good, "fsdpp_machine: 1", "fsdpp_machine: 2"), "m.yaml"),
                       doctest::Contains("reads version 1"), UsageError);
  CHECK_THROWS_WITH_AS(machine_from_yaml("a: [", "m.yaml"), doctest::Contains("not valid YAML"), UsageError);
  CHECK_THROWS_WITH_AS(load_machine("no-such-machine"), doctest::Contains("neither a preset"), UsageError);
}

TEST_CASE("machine: collective times by hand") {
  const LinkFigures link{10, 100};  // 10 us per step, 100 GB/s
  const double S = 1e9;
  // all_gather / reduce_scatter, ring over 8: 7 steps, (n-1)/n of S.
  CHECK(collective_seconds(link, CollectiveOp::all_gather, S, 8, false, false) == doctest::Approx(7e-5 + 8.75e-3));
  CHECK(collective_seconds(link, CollectiveOp::reduce_scatter, S, 8, false, false) == doctest::Approx(7e-5 + 8.75e-3));
  // all_reduce: twice the bytes; ring 14 steps, tree 2 ceil(log2 8) = 6.
  CHECK(collective_seconds(link, CollectiveOp::all_reduce, S, 8, false, false) == doctest::Approx(14e-5 + 17.5e-3));
  CHECK(collective_seconds(link, CollectiveOp::all_reduce, S, 8, true, false) == doctest::Approx(6e-5 + 17.5e-3));
  // measured: the latency once; one rank: nothing.
  CHECK(collective_seconds(link, CollectiveOp::all_reduce, S, 8, false, true) == doctest::Approx(1e-5 + 17.5e-3));
  CHECK(collective_seconds(link, CollectiveOp::all_gather, S, 1, false, false) == 0);

  Machine m = *machine_preset("h100-sxm-8x");
  m.intra_node.ring = {3, 360};
  m.intra_node.tree = {2, 300};
  // all_reduce takes the faster algorithm: small buffers the tree (latency), large ones the ring (bandwidth).
  const double small = collective_seconds(m, CollectiveOp::all_reduce, 1024, 8, false);
  CHECK(small == doctest::Approx(collective_seconds(m.intra_node.tree, CollectiveOp::all_reduce, 1024, 8, true, false)));
  const double large = collective_seconds(m, CollectiveOp::all_reduce, std::int64_t{1} << 32, 8, false);
  CHECK(large == doctest::Approx(collective_seconds(m.intra_node.ring, CollectiveOp::all_reduce, std::int64_t{1} << 32, 8,
                                                    false, false)));
  // A measured entry overrides ring and tree for its operation only.
  m.intra_node.all_gather = LinkFigures{40, 2};
  CHECK(collective_seconds(m, CollectiveOp::all_gather, 2e9, 4, false) == doctest::Approx(40e-6 + 2e9 * 0.75 / 2e9));
  // Across nodes: the inter-node class.
  CHECK(collective_seconds(m, CollectiveOp::reduce_scatter, S, 16, true) ==
        doctest::Approx(collective_seconds(m.inter_node.ring, CollectiveOp::reduce_scatter, S, 16, false, false)));
  // A group with one rank per node (stride 8) gets one NIC's share of the node's bandwidth across nodes; a group
  // filling its nodes all of it; measured figures (calibrate's, fitted per node) alike.
  CHECK(group_ranks_per_node(m, 8, 4) == 1);
  CHECK(group_ranks_per_node(m, 2, 16) == 4);
  CHECK(group_ranks_per_node(m, 1, 4) == 4);
  const double whole = collective_seconds(m, CollectiveOp::all_gather, S, 16, true, 8);
  const double one = collective_seconds(m, CollectiveOp::all_gather, S, 16, true, 1);
  CHECK(one - 15 * m.inter_node.ring.latency_us * 1e-6 ==
        doctest::Approx(8 * (whole - 15 * m.inter_node.ring.latency_us * 1e-6)));
  CHECK(collective_seconds(m, CollectiveOp::all_gather, S, 4, false, 1) ==
        doctest::Approx(collective_seconds(m, CollectiveOp::all_gather, S, 4, false, 8)));  // inside a node: no share
  m.inter_node.all_reduce = LinkFigures{50, 4};
  CHECK(collective_seconds(m, CollectiveOp::all_reduce, S, 2, true, 8) == doctest::Approx(50e-6 + S * 1.0 / 4e9));
  CHECK(collective_seconds(m, CollectiveOp::all_reduce, S, 2, true, 2) == doctest::Approx(50e-6 + S * 1.0 / 1e9));
  // Node membership: rank r on node r / 8.
  CHECK_FALSE(group_spans_nodes(m, 0, 1, 8));
  CHECK(group_spans_nodes(m, 0, 1, 16));
  CHECK(group_spans_nodes(m, 0, 8, 2));
  CHECK_FALSE(group_spans_nodes(m, 0, 2, 4));
}

TEST_CASE("machine: GEMM time follows the curve, or the nearest measured point; kernels cost overhead plus bytes") {
  Machine m = *machine_preset("h100-sxm-8x");
  m.bf16 = {1000, 8};
  const double flops = 2.0 * 4096 * 4096 * 4096;
  CHECK(gemm_seconds(m, "bf16", 4096, 4096, 4096) == doctest::Approx(flops / (1000e12 * flops / (flops + 8e9))));
  // Half the peak at half_gflop.
  const double half = gemm_seconds(m, "bf16", 1000, 1000, 4000);  // 8 GFLOP
  CHECK(8e9 / half == doctest::Approx(500e12));
  CHECK(gemm_seconds(m, "bf16", 64, 64, 64, 10) == doctest::Approx(10 * gemm_seconds(m, "bf16", 64, 64, 64)));
  m.gemm_points = {{"bf16", 256, 256, 256, 1.0}, {"bf16", 4096, 4096, 4096, 600}};
  CHECK(gemm_seconds(m, "bf16", 4000, 4096, 4096) == doctest::Approx(2.0 * 4000 * 4096 * 4096 / 600e12));
  CHECK(gemm_seconds(m, "bf16", 300, 256, 256) == doctest::Approx(2.0 * 300 * 256 * 256 / 1e12));
  m.kernel_overhead_us = 5;
  m.memory_bandwidth_gbs = 1000;
  CHECK(kernel_seconds(m, 1e9) == doctest::Approx(5e-6 + 1e-3));
}

namespace {

// A 2 x 2 x 2 grid of f32 points: rate = base at (64, 64, 64), + du per factor 4 of m, + dn per factor 4 of n.
Machine grid_machine() {
  Machine m = *machine_preset("h100-sxm-8x");
  for (std::int64_t mm : {64, 256})
    for (std::int64_t nn : {64, 256})
      for (std::int64_t kk : {64, 256})
        m.gemm_points.push_back({"f32", mm, nn, kk, 1.0 + (mm == 256 ? 2.0 : 0.0) + (nn == 256 ? 4.0 : 0.0)});
  return m;
}

double tflops_of(const Machine& m, std::int64_t rows, std::int64_t cols, std::int64_t inner) {
  return 2.0 * rows * cols * inner / gemm_seconds(m, "f32", rows, cols, inner) / 1e12;
}

}  // namespace

TEST_CASE("machine: a grid of gemm_points is interpolated in log m, log n, log k and clamped at its edges") {
  const Machine m = grid_machine();
  CHECK(tflops_of(m, 64, 64, 64) == doctest::Approx(1.0));  // on the grid: the point itself
  CHECK(tflops_of(m, 256, 256, 64) == doctest::Approx(7.0));
  // Half-way in log between 64 and 256 (128): half-way in rate; k does not change the rate here.
  CHECK(tflops_of(m, 128, 64, 64) == doctest::Approx(2.0));
  CHECK(tflops_of(m, 128, 128, 100) == doctest::Approx(1.0 + 1.0 + 2.0));
  // A quarter of the way (log 64 -> log 256 is two doublings; 90.5 is half a doubling up).
  CHECK(tflops_of(m, 91, 64, 64) == doctest::Approx(1.0 + 2.0 * std::log(91.0 / 64) / std::log(4.0)));
  // Outside the grid: the edge's rate, in every direction (no extrapolated rise or fall).
  CHECK(tflops_of(m, 4096, 64, 64) == doctest::Approx(3.0));
  CHECK(tflops_of(m, 8, 8, 8) == doctest::Approx(1.0));
  CHECK(tflops_of(m, 100000, 100000, 16) == doctest::Approx(7.0));
  // Monotone between neighbours: rates along m stay within the two points'.
  for (std::int64_t rows = 64; rows <= 256; rows += 16) {
    CHECK(tflops_of(m, rows, 64, 64) >= 1.0 - 1e-12);
    CHECK(tflops_of(m, rows, 64, 64) <= 3.0 + 1e-12);
  }
  // Other precisions have no points: the curve prices them, as before.
  CHECK(gemm_seconds(m, "bf16", 256, 256, 256) ==
        doctest::Approx(gemm_seconds(*machine_preset("h100-sxm-8x"), "bf16", 256, 256, 256)));
}

TEST_CASE("machine: points that are not a full grid fall back to the nearest point") {
  Machine m = grid_machine();
  m.gemm_points.pop_back();  // (256, 256, 256) missing: not a grid
  CHECK(tflops_of(m, 128, 64, 64) == doctest::Approx(1.0));  // nearest (64, 64, 64), a tie broken by the first
  CHECK(tflops_of(m, 200, 64, 64) == doctest::Approx(3.0));
}

TEST_CASE("machine: blas_threads_per_rank round-trips and a run with another count is warned about") {
  Machine m = grid_machine();
  m.name = "here";
  CHECK(blas_threads_mismatch(m, 2, "--machine").empty());  // not recorded: nothing to compare
  CHECK(to_yaml(m).find("blas_threads_per_rank") == std::string::npos);
  m.blas_threads_per_rank = 1;
  const Machine back = machine_from_yaml(to_yaml(m), "test");
  CHECK(back.blas_threads_per_rank == 1);
  CHECK(blas_threads_mismatch(back, 1, "--machine").empty());
  CHECK(blas_threads_mismatch(back, 0, "--machine").empty());  // the library does not say (cuBLAS)
  const std::string w = blas_threads_mismatch(back, 2, "run.machine");
  CHECK(w.find("run.machine 'here' was calibrated with 1 BLAS thread(s) per rank") != std::string::npos);
  CHECK(w.find("the run uses 2") != std::string::npos);
  CHECK(w.find("OPENBLAS_NUM_THREADS=1") != std::string::npos);
  std::string text = to_yaml(m);
  text.replace(text.find("blas_threads_per_rank: 1"), 24, "blas_threads_per_rank: 1.5");
  CHECK_THROWS_WITH_AS(machine_from_yaml(text, "m.yaml"), doctest::Contains("blas_threads_per_rank is 1.5"), UsageError);
}

TEST_CASE("simulate: overlap hides communication shorter than compute, exposes the rest, and prefetch matters") {
  SUBCASE("an all-gather issued before 3 ms of compute and taking 2 ms is hidden") {
    const SimulatedStep s = simulate({issue(0, 2e-3), compute(3e-3), wait(0), compute(1e-3)});
    CHECK(s.seconds == doctest::Approx(4e-3));
    CHECK(s.exposed_total_s() == doctest::Approx(0));
    CHECK(s.critical_resource() == "compute");
  }
  SUBCASE("taking 5 ms, it exposes comm - compute = 2 ms, charged to its stream") {
    const SimulatedStep s = simulate({issue(0, 5e-3), compute(3e-3), wait(0), compute(1e-3)});
    CHECK(s.seconds == doctest::Approx(6e-3));
    CHECK(s.exposed_s.at("dp_shard") == doctest::Approx(2e-3));
    CHECK(s.busy_s.at("dp_shard") == doctest::Approx(5e-3));
    CHECK(s.critical_resource() == "dp_shard");
  }
  SUBCASE("without prefetch each unit's all-gather is issued and waited before its compute: all exposed") {
    std::vector<TimedOp> none, one;
    for (int u = 0; u < 4; ++u) none.insert(none.end(), {issue(u, 1e-3), wait(u), compute(2e-3)});
    // Prefetch 1: unit u+1's all-gather is issued when unit u starts computing.
    one.push_back(issue(0, 1e-3));
    for (int u = 0; u < 4; ++u) {
      one.push_back(wait(u));
      if (u + 1 < 4) one.push_back(issue(u + 1, 1e-3));
      one.push_back(compute(2e-3));
    }
    const SimulatedStep a = simulate(none), b = simulate(one);
    CHECK(a.exposed_total_s() == doctest::Approx(4e-3));
    CHECK(a.seconds == doctest::Approx(12e-3));
    CHECK(b.exposed_total_s() == doctest::Approx(1e-3));  // only the first unit's gather
    CHECK(b.seconds == doctest::Approx(9e-3));
  }
  SUBCASE("one stream runs its collectives one at a time; another stream runs beside it") {
    const SimulatedStep s = simulate({issue(0, 2e-3), issue(1, 2e-3), issue(2, 2e-3, "dp_replicate"), wait(1), wait(2)});
    CHECK(s.seconds == doctest::Approx(4e-3));
    CHECK(s.exposed_s.at("dp_shard") == doctest::Approx(4e-3));
  }
  SUBCASE("beside compute, each slows the other while both run; with both slowdowns 0 nothing changes") {
    // 1 s of compute beside a 1 s collective that slows compute by 25% and is slowed by 50%: both run at once
    // until the compute ends at 1.25 s (1 / 1.25 of its work per second), by then the collective has done
    // 1.25 / 1.5 of its second; its last 1/6 s runs alone.
    const SimulatedStep s = simulate({contended(0, 1.0, 0.25, 0.5), compute(1.0), wait(0)});
    CHECK(s.compute_s == doctest::Approx(1.25));
    CHECK(s.seconds == doctest::Approx(1.25 + 1.0 / 6));
    CHECK(s.exposed_s.at("dp_shard") == doctest::Approx(1.0 / 6));
    CHECK(s.busy_s.at("dp_shard") == doctest::Approx(1.25 + 1.0 / 6));
    // A collective that ends first: 0.5 s beside 2 s of compute, compute at 1/1.25 until the collective's 0.75 s.
    const SimulatedStep t = simulate({contended(0, 0.5, 0.25, 0.5), compute(2.0), wait(0)});
    CHECK(t.busy_s.at("dp_shard") == doctest::Approx(0.75));
    CHECK(t.compute_s == doctest::Approx(0.75 + (2.0 - 0.75 / 1.25)));
    CHECK(t.exposed_total_s() == doctest::Approx(0));
    const SimulatedStep plain = simulate({issue(0, 5e-3), compute(3e-3), wait(0), compute(1e-3)}),
                        zero = simulate({contended(0, 5e-3, 0, 0), compute(3e-3), wait(0), compute(1e-3)});
    CHECK(zero.seconds == plain.seconds);
    CHECK(zero.exposed_total_s() == plain.exposed_total_s());
  }
  SUBCASE("collectives never waited for are waited at the end") {
    const SimulatedStep s = simulate({compute(1e-3), issue(0, 3e-3)});
    CHECK(s.seconds == doctest::Approx(4e-3));
    CHECK(s.exposed_total_s() == doctest::Approx(3e-3));
  }
}

TEST_CASE("plan_step: the priced FLOPs are the trainer's MFU formula, and the figures are consistent") {
  const Machine m = *machine_preset("h100-sxm-8x");
  for (const char* deck_name : {"small.yaml", "llama-tiny.yaml"})
    for (const char* ac : {"none", "full"})
      for (int ranks : {1, 2, 4}) {
        CAPTURE(deck_name);
        CAPTURE(ac);
        CAPTURE(ranks);
        const Deck deck = test::input_deck(deck_name, {"train.micro_batch=1", std::string("train.activation_checkpointing=") + ac});
        const StepPlan p = plan_step(deck, ranks, m);
        const double tokens_per_rank = double(deck.train.global_batch) * deck.model.context_length / ranks;
        const double formula = make_model(deck.model)->flops_per_token(deck.model.context_length) * tokens_per_rank;
        CHECK(p.time.model_flops_per_rank == doctest::Approx(formula).epsilon(1e-9));
        CHECK(p.time.priced_flops_per_rank == doctest::Approx(formula).epsilon(1e-9));
        CHECK(p.time.ms_per_step > 0);
        CHECK(p.time.tokens_per_s == doctest::Approx(p.time.tokens_per_s_per_device * ranks));
        CHECK(p.time.mfu > 0);
        CHECK(p.time.mfu < 1);
        CHECK(p.time.ms_per_step >= p.time.compute_ms - 1e-9);
        CHECK(p.memory.memory.total() == plan_memory(deck, ranks).memory.total());  // the same dry step
        if (std::string(ac) == "full") CHECK(p.time.compute_ms_by_what.count("recompute"));
        if (ranks > 1) CHECK(p.time.busy_comm_ms.count("dp_shard"));
      }
}

TEST_CASE("plan_step: blocking reductions are not faster than overlapped ones; recomputation costs time") {
  const Machine m = *machine_preset("a100-sxm-8x");
  auto ms = [&](std::vector<std::string> o) {
    o.push_back("train.micro_batch=2");
    return plan_step(test::input_deck("small.yaml", o), 4, m).time.ms_per_step;
  };
  CHECK(ms({"comm.overlap=true"}) <= ms({"comm.overlap=false"}));
  CHECK(ms({"train.activation_checkpointing=none"}) < ms({"train.activation_checkpointing=full"}));
  CHECK(ms({"fsdp.forward_prefetch=1", "fsdp.backward_prefetch=1"}) <= ms({"fsdp.forward_prefetch=0", "fsdp.backward_prefetch=0"}));
}

TEST_CASE("plan_step: backward kernels run at backward_bandwidth_gbs and the optimizer at optimizer_bandwidth_gbs") {
  const Deck deck = test::input_deck("llama-tiny.yaml", {"train.micro_batch=4"});
  Machine m = *machine_preset("h100-sxm-8x");
  const StepTime base = plan_step(deck, 1, m).time;
  // The preset's memory bandwidth given as the backward one explicitly: nothing changes.
  m.backward_bandwidth_gbs = m.memory_bandwidth_gbs;
  CHECK(plan_step(deck, 1, m).time.ms_per_step == doctest::Approx(base.ms_per_step).epsilon(1e-12));
  // Faster backward kernels: backward shrinks, forward and the optimizer do not move.
  m.backward_bandwidth_gbs = 4 * m.memory_bandwidth_gbs;
  const StepTime fast_backward = plan_step(deck, 1, m).time;
  CHECK(fast_backward.compute_ms_by_what.at("backward") < base.compute_ms_by_what.at("backward"));
  CHECK(fast_backward.compute_ms_by_what.at("forward") == doctest::Approx(base.compute_ms_by_what.at("forward")));
  CHECK(fast_backward.compute_ms_by_what.at("optimizer") == doctest::Approx(base.compute_ms_by_what.at("optimizer")));
  // A slower optimizer: its bytes (optimizer_passes x 4 per parameter of one rank) at the new bandwidth.
  m.optimizer_bandwidth_gbs = m.memory_bandwidth_gbs / 10;
  const StepTime slow_optimizer = plan_step(deck, 1, m).time;
  const double numel = double(plan_memory(deck, 1).memory.parameters) / 4;
  const double bytes_ms = optimizer_passes(deck.optim) * 4 * numel / (m.optimizer_bandwidth_gbs * 1e9) * 1e3;
  CHECK(optimizer_passes(deck.optim) == 8);  // AdamW: the norm's read, then four reads and three writes
  CHECK(slow_optimizer.compute_ms_by_what.at("optimizer") > bytes_ms);
  CHECK(slow_optimizer.compute_ms_by_what.at("optimizer") - bytes_ms ==
        doctest::Approx(base.compute_ms_by_what.at("optimizer") -
                        optimizer_passes(deck.optim) * 4 * numel / (m.memory_bandwidth_gbs * 1e9) * 1e3));
}

TEST_CASE("plan_step: backward's replay stops before each block's output projection; backward makes no pass over "
          "the logits") {
  const Machine preset = *machine_preset("h100-sxm-8x");
  // GEMMs only (elementwise kernels free), and elementwise kernels only (GEMMs free).
  Machine gemms = preset, kernels = preset;
  gemms.memory_bandwidth_gbs = gemms.backward_bandwidth_gbs = 1e12;
  gemms.kernel_overhead_us = kernels.kernel_overhead_us = 0;
  for (GemmCurve* c : {&kernels.f32, &kernels.tf32, &kernels.bf16}) c->peak_tflops = 1e12;
  kernels.gemm_points.clear();
  const std::vector<std::string> layout{"train.micro_batch=2", "train.global_batch=2"};
  auto with = [&](std::vector<std::string> o) {
    o.insert(o.end(), layout.begin(), layout.end());
    return test::input_deck("small.yaml", o);
  };
  const Deck deck = with({"train.activation_checkpointing=full"});
  const StepTime t = plan_step(deck, 1, gemms).time;
  const std::int64_t N = std::int64_t{2} * deck.model.context_length, C = deck.model.n_embd, V = deck.model.vocab_size;
  // Forward runs every block's GEMMs and the head's; the replay all of a block's but Wd (N x 4C) x (4C x C).
  const double wd = gemm_seconds(gemms, t.precision, N, C, 4 * C), head = gemm_seconds(gemms, t.precision, N, V, C);
  CHECK(t.compute_ms_by_what.at("forward") - t.compute_ms_by_what.at("recompute") ==
        doctest::Approx((head + deck.model.n_layer * wd) * 1e3).epsilon(1e-6));
  // Under tp 2 the replay reduces attention's output (blocking), not the block's: one all-reduce a block, where
  // forward and backward issue two each (and the root one each).
  auto tp_ms = [&](const char* ac) {
    return plan_step(with({"mesh.tp=2", std::string("train.activation_checkpointing=") + ac}), 2, gemms)
        .time.busy_comm_ms.at("tp");
  };
  const double L = deck.model.n_layer;
  CHECK(tp_ms("full") / tp_ms("none") == doctest::Approx((5 * L + 2) / (4 * L + 2)).epsilon(1e-9));
  // The fused cross-entropy leaves d(logits) in forward: a larger vocabulary adds logits traffic to forward only.
  auto pass_ms = [&](const char* vocab, const char* what) {
    return plan_step(with({std::string("model.vocab_size=") + vocab}), 1, kernels).time.compute_ms_by_what.at(what);
  };
  CHECK(pass_ms("8192", "forward") > pass_ms("4096", "forward"));
  CHECK(pass_ms("8192", "backward") == doctest::Approx(pass_ms("4096", "backward")).epsilon(1e-9));
}

TEST_CASE("plan_step: a kernel family's own rate prices that family only, in the blocks that run it") {
  const Machine preset = *machine_preset("h100-sxm-8x");
  const Deck llama = test::input_deck("llama-tiny.yaml", {"train.micro_batch=4", "model.attention=batched"});
  const Deck gpt = test::input_deck("small.yaml", {"train.micro_batch=1", "model.attention=batched"});
  auto with = [&](const std::string& family, double forward, double backward) {
    Machine m = preset;
    m.kernels[family] = {forward, backward};
    return m;
  };
  auto ms = [](const Deck& d, const Machine& m, const char* what) { return plan_step(d, 1, m).time.compute_ms_by_what.at(what); };
  const double slow = preset.memory_bandwidth_gbs / 100;
  // SwiGLU runs in Llama's blocks, not in GPT-2's; gelu the other way round; the softmax in both (materialized).
  CHECK(ms(llama, with("swiglu", slow, preset.memory_bandwidth_gbs), "forward") > ms(llama, preset, "forward"));
  CHECK(ms(llama, with("swiglu", preset.memory_bandwidth_gbs, slow), "forward") ==
        doctest::Approx(ms(llama, with("swiglu", preset.memory_bandwidth_gbs, preset.memory_bandwidth_gbs), "forward")));
  CHECK(ms(llama, with("swiglu", preset.memory_bandwidth_gbs, slow), "backward") > ms(llama, preset, "backward"));
  CHECK(ms(gpt, with("swiglu", slow, slow), "forward") == doctest::Approx(ms(gpt, preset, "forward")));
  CHECK(ms(gpt, with("gelu", slow, slow), "forward") > ms(gpt, preset, "forward"));
  CHECK(ms(llama, with("gelu", slow, slow), "forward") == doctest::Approx(ms(llama, preset, "forward")));
  CHECK(ms(gpt, with("softmax", slow, slow), "forward") > ms(gpt, preset, "forward"));
  // The fused attention keeps the scores on chip: no softmax pass to price.
  const Deck fused = test::input_deck("small.yaml", {"train.micro_batch=1", "model.attention=fused"});
  CHECK(ms(fused, with("softmax", slow, slow), "forward") == doctest::Approx(ms(fused, preset, "forward")));
}

namespace {

// Records the schedule events of a dry step: issues per operation (distinct ids), waits, and the order of
// passes, issues and waits.
struct ScheduleLedger final : FsdpMemoryListener {
  std::map<CollectiveOp, std::set<int>> issued;
  std::set<int> waited;
  std::vector<std::string> order;  // "issue", "wait", "begin", "end"
  int passes = 0;
  void on_memory(const FsdpMemoryEvent&) override {}
  void on_schedule(const FsdpScheduleEvent& e) override {
    using K = FsdpScheduleEvent::Kind;
    if (e.kind == K::issue) issued[e.op].insert(e.id), order.push_back("issue");
    if (e.kind == K::wait) waited.insert(e.id), order.push_back("wait");
    if (e.kind == K::pass_begin) ++passes, order.push_back("begin");
    if (e.kind == K::pass_end) order.push_back("end");
  }
};

}  // namespace

TEST_CASE("schedule events: a dry step issues what fully_shard counts, waits for every one, and prefetch 0 waits "
          "at once") {
  for (const char* strategy : {"full_shard", "hybrid_shard", "no_shard"})
    for (const char* prefetch : {"0", "1"}) {
      CAPTURE(strategy);
      CAPTURE(prefetch);
      std::vector<std::string> o = {"train.micro_batch=1", std::string("fsdp.strategy=") + strategy,
                                    std::string("fsdp.forward_prefetch=") + prefetch,
                                    std::string("fsdp.backward_prefetch=") + prefetch};
      if (std::string(strategy) == "hybrid_shard") o.push_back("mesh.dp_replicate=2");
      const Deck deck = test::input_deck("tiny.yaml", o);
      Gpt model(deck.model);
      const auto par = parallelize_for_planning(model, deck, 4);
      auto ledger = std::make_shared<ScheduleLedger>();
      par->root().add_memory_listener(ledger);
      Flow flow;
      const int micro_batches = grad_accum_steps(deck.train, par->data_parallel_size());
      for (int a = 0; a < micro_batches; ++a) {
        par->before_micro_batch(a, micro_batches);
        model.dry_run(flow, Pass::forward);
        model.dry_run(flow, Pass::backward);
      }
      finish_gradient_reduction(par->root().module());
      const FsdpStats stats = fsdp_stats(par->root().module());
      CHECK(ledger->issued[CollectiveOp::all_gather].size() ==
            static_cast<std::size_t>(stats.forward_all_gathers + stats.backward_all_gathers));
      CHECK(ledger->issued[CollectiveOp::reduce_scatter].size() == static_cast<std::size_t>(stats.reduce_scatters));
      CHECK(ledger->issued[CollectiveOp::all_reduce].size() == static_cast<std::size_t>(stats.all_reduces));
      std::size_t issued = 0;
      for (const auto& [op, ids] : ledger->issued) {
        issued += ids.size();
        for (int id : ids) CHECK(ledger->waited.count(id) == 1);
      }
      CHECK(issued > 0);
      CHECK(ledger->passes == 2 * micro_batches * (deck.model.n_layer + 1));
      if (std::string(prefetch) == "0" && std::string(strategy) == "full_shard")
        for (std::size_t i = 0; i + 1 < ledger->order.size(); ++i)
          if (ledger->order[i] == "issue") CHECK(ledger->order[i + 1] != "begin");  // nothing computes under it
    }
}
