#include "fsdpp/plan/layout_search.hpp"

#include "fsdpp/plan/pipeline_plan.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace fsdpp {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

// The pipelines a deck of `layers` blocks may take on `ranks` ranks (overrides): none, and for each pp dividing the
// ranks (the outermost dimension) 1f1b, zero_bubble, and interleaved_1f1b with 2 stages per rank where the blocks
// allow (the deck's rules drop those the micro-batches or the mesh do not allow).
std::vector<std::vector<std::string>> pipelines(int ranks, int layers) {
  std::vector<std::vector<std::string>> out = {{"mesh.pp=1"}};
  for (int pp : divisors(ranks)) {
    if (pp == 1 || pp > layers) continue;
    out.push_back({fmt::format("mesh.pp={}", pp), "pipeline.schedule=1f1b"});
    out.push_back({fmt::format("mesh.pp={}", pp), "pipeline.schedule=zero_bubble"});
    if (2 * pp <= layers)
      out.push_back({fmt::format("mesh.pp={}", pp), "pipeline.schedule=interleaved_1f1b", "pipeline.virtual_stages=2"});
  }
  return out;
}

// A layout's plan: one step of the whole job, or under a pipeline its priced replay with the memory of the stage
// that needs most.
StepPlan plan_layout(const Deck& deck, int ranks, const Machine& machine) {
  if (deck.mesh.pp == 1) return plan_step(deck, ranks, machine);
  PipelineStepPlan p = plan_pipeline_step(deck, ranks, machine);
  const auto most = std::max_element(p.stages.begin(), p.stages.end(), [](const StepPlan& a, const StepPlan& b) {
    return a.memory.memory.total() < b.memory.memory.total();
  });
  return {most->memory, p.time};
}

// The data-parallel meshes of `dp` ranks: full_shard over all of them, and HSDP with the shard groups filling
// whole nodes' worth of data-parallel ranks (and twice that), as HSDP is used. A mixture of `experts` experts
// (0: dense) takes each expert-parallel size that divides both the shard group and the experts (mesh.ep).
std::vector<std::vector<std::string>> data_parallel_meshes(int dp, int dp_per_node, int experts) {
  std::vector<std::pair<std::vector<std::string>, int>> meshes = {{{"fsdp.strategy=full_shard", "mesh.dp_shard=-1"}, dp}};
  for (int shard : {dp_per_node, 2 * dp_per_node})
    if (shard > 1 && shard < dp && dp % shard == 0)
      meshes.push_back({{"fsdp.strategy=hybrid_shard", fmt::format("mesh.dp_replicate={}", dp / shard),
                         fmt::format("mesh.dp_shard={}", shard)}, shard});
  std::vector<std::vector<std::string>> out;
  for (const auto& [mesh, shard] : meshes)
    for (int ep : divisors(shard)) {
      if (ep > 1 && (experts == 0 || experts % ep != 0)) continue;
      out.push_back(mesh);
      out.back().push_back(fmt::format("mesh.ep={}", ep));
    }
  return out;
}

std::string layout_line(const Deck& d, const StepPlan& p) {
  std::string mesh = d.mesh.pp > 1 ? fmt::format("pp {}{} ({}) x ", d.mesh.pp,
                                                 d.pipeline.virtual_stages > 1
                                                     ? fmt::format(" x {}", d.pipeline.virtual_stages) : "",
                                                 to_string(d.pipeline.schedule))
                                   : std::string();
  bool first = true;
  for (const MeshDim& m : p.memory.mesh) mesh += fmt::format("{}{} {}", std::exchange(first, false) ? "" : " x ", m.name, m.size);
  if (d.mesh.ep > 1) mesh += fmt::format(" (ep {})", d.mesh.ep);
  return fmt::format("{}, {}, reshard {}, ac {}, mb {} x {}, {}", mesh, to_string(d.fsdp.strategy),
                     to_string(d.fsdp.reshard_after_forward), to_string(d.train.activation_checkpointing),
                     p.memory.micro_batch, p.memory.accum_steps, dtype_name(d.fsdp.param_dtype));
}

}  // namespace

std::vector<Candidate> search_layouts(const DeckWith& deck_with, int ranks, const Machine& machine) {
  const Deck base = deck_with({});
  const auto fits = static_cast<std::int64_t>(machine.memory_gib * 1073741824.0);
  std::vector<Candidate> out;
  for (const std::vector<std::string>& pipeline : pipelines(ranks, base.model.n_layer))
  for (int tp : divisors(std::min(ranks, machine.devices_per_node)))  // tensor parallelism inside a node
    for (int cp : divisors(ranks / std::max(1, tp))) {  // context parallelism: powers of two the sequence allows
      const int pp = std::stoi(pipeline[0].substr(std::string("mesh.pp=").size()));
      if (ranks % (tp * pp) || base.model.n_head % tp || (cp & (cp - 1)) != 0 || (ranks / pp) % (tp * cp)) continue;
      if (cp > 1 && base.model.context_length % (2 * cp) != 0) continue;
      const int dp = ranks / pp / tp / cp, per_rank = base.train.global_batch / std::max(1, dp);
      if (per_rank < 1) continue;
      std::vector<int> micro_batches;
      for (int b : divisors(per_rank))
        if ((b & (b - 1)) == 0 || b == per_rank) micro_batches.push_back(b);  // powers of two, and all at once
      const int experts = is_moe_arch(base.model.arch) ? base.model.moe.num_experts : 0;
      // A pipeline keeps its stage's parameters whole through the step (its default): the reshard choice is moot.
      const std::vector<const char*> reshards = pp > 1 ? std::vector<const char*>{"false"}
                                                       : std::vector<const char*>{"true", "false"};
      for (const auto& mesh : data_parallel_meshes(dp, std::max(1, machine.devices_per_node / tp / cp), experts))
        for (const char* reshard : reshards)
          for (const char* ac : {"none", "full"})
            for (int b : micro_batches)
              for (const char* dtype : {"bf16", "f32"}) {
                Candidate c;
                c.overrides = pipeline;
                c.overrides.insert(c.overrides.end(), mesh.begin(), mesh.end());
                c.overrides.push_back(fmt::format("mesh.tp={}", tp));
                c.overrides.push_back(fmt::format("mesh.cp={}", cp));
                c.overrides.push_back(fmt::format("fsdp.reshard_after_forward={}", reshard));
                c.overrides.push_back(fmt::format("train.activation_checkpointing={}", ac));
                c.overrides.push_back(fmt::format("train.micro_batch={}", b));
                c.overrides.push_back(fmt::format("fsdp.param_dtype={}", dtype));
                try {
                  const Deck deck = deck_with(c.overrides);  // the trainer's rules decide what may run
                  c.plan = plan_layout(deck, ranks, machine);
                  c.layout = layout_line(deck, c.plan);
                } catch (const UsageError&) {
                  continue;  // a layout the trainer would refuse (divisibility, heads over tp, ...)
                }
                if (c.plan.memory.memory.total() <= fits) out.push_back(std::move(c));
              }
    }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    return a.plan.time.ms_per_step < b.plan.time.ms_per_step;
  });
  return out;
}

std::string why_best(const std::vector<Candidate>& best) {
  if (best.empty()) return "no layout fits";
  const StepTime& a = best[0].plan.time;
  if (best.size() == 1) return fmt::format("the only layout that fits; critical resource {}", a.critical_resource);
  const StepTime& b = best[1].plan.time;
  double exposed_a = 0, exposed_b = 0;
  for (const auto& [d, ms] : a.exposed_comm_ms) exposed_a += ms;
  for (const auto& [d, ms] : b.exposed_comm_ms) exposed_b += ms;
  const double gain = 100.0 * (b.ms_per_step - a.ms_per_step) / b.ms_per_step;
  const std::string reason = b.compute_ms - a.compute_ms >= exposed_b - exposed_a
      ? fmt::format("less compute ({:.1f} vs {:.1f} ms: fewer recomputed FLOPs, larger GEMMs or cheaper precision)",
                    a.compute_ms, b.compute_ms)
      : fmt::format("less exposed communication ({:.1f} vs {:.1f} ms)", exposed_a, exposed_b);
  return fmt::format("{:.1f}% faster than #2 ({}): {}; critical resource {}", gain, best[1].layout, reason,
                     a.critical_resource);
}


std::string format_search(const std::vector<Candidate>& best, int ranks, const Machine& machine, std::size_t shown) {
  std::string out = fmt::format("Layouts of {} rank(s) on {} that fit in {:g} GiB per device, fastest first ({} fit):\n",
                                ranks, machine.name, machine.memory_gib, best.size());
  out += fmt::format("  {:>3} {:>10} {:>12} {:>7} {:>11} {:>9}  {}\n", "#", "ms/step", "tok/s/dev", "MFU",
                     "exposed ms", "mem GiB", "layout");
  for (std::size_t i = 0; i < std::min(shown, best.size()); ++i) {
    const StepTime& t = best[i].plan.time;
    double exposed = 0;
    for (const auto& [d, ms] : t.exposed_comm_ms) exposed += ms;
    out += fmt::format("  {:>3} {:>10.1f} {:>12.0f} {:>7.3f} {:>11.1f} {:>9.1f}  {}\n", i + 1, t.ms_per_step,
                       t.tokens_per_s_per_device, t.mfu, exposed,
                       best[i].plan.memory.memory.total() / 1073741824.0, best[i].layout);
  }
  out += fmt::format("why #1: {}\n", why_best(best));
  if (!best.empty()) out += fmt::format("to use it: add {}\n", fmt::join(best[0].overrides, " "));
  return out;
}

}  // namespace fsdpp
