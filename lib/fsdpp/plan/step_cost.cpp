#include "fsdpp/plan/step_cost.hpp"


#include "fsdpp/config/deck_rules.hpp"
#include "fsdpp/fsdp/fully_shard.hpp"
#include "fsdpp/nn/attention_kind.hpp"
#include "fsdpp/nn/causal_lm.hpp"
#include "fsdpp/nn/decoder_block.hpp"
#include "fsdpp/optim/deck_optimizer.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/matmul.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <cmath>

namespace fsdpp {
namespace {

// Every GEMM output gets one elementwise pass (bias, rope, or the write and read of it): 4 bytes written, 4 read.
constexpr double kPassBytesPerOutput = 8;
// Per element of a (rows, C) activation: a norm writes its output and reads it again (its stats: twice 4 bytes);
// a residual add reads two inputs and writes one (3 x 4).
constexpr double kNormBytesPerElement = 8, kResidualBytesPerElement = 12;

// A GEMM (m x k)(k x n), `count` times.
struct Gemm {
  std::int64_t m = 0, n = 0, k = 0, count = 1;
  double flops() const { return 2.0 * m * n * k * count; }
};

// Part of a unit between two tensor-parallel collectives (a Megatron region: attention, or the MLP), or the
// whole unit without tensor parallelism.
struct Region {
  std::vector<Gemm> weights;    // forward GEMMs with a weight: backward runs dX (m,k,n) then dW (n,k,m)
  std::vector<Gemm> products;   // attention's score and value products: backward runs two of each
  double bytes = 0;             // forward elementwise traffic (norms, residuals, biases, rope)
  std::map<std::string, double> family_bytes;  // forward traffic of the kernels priced by family (machine.hpp)
  int kernels = 0;              // forward elementwise kernels
  double forward_only_bytes = 0;  // part of `bytes` that backward does not pass over again (the logits)
  bool reduces_output = true;   // under tp, forward ends the region with its output's reduction
  double elementwise_flops = 0; // forward FLOPs of multiplying parameters outside GEMMs (norms, biases)
  std::int64_t exchanged_bytes = 0;  // expert parallelism: the rows each exchange moves (routed experts' unit)
};

// The shapes and machine a step is priced with.
struct Pricing {
  const Machine* machine = nullptr;
  std::string precision;
  int B = 1, T = 1, C = 1, n_head = 1, tp = 1;
  int experts = 0, top_k = 0, ep = 1;  // model.moe and mesh.ep
  // mesh.cp: T above is this rank's T / cp rows of each sequence, every query of them attends over T_keys = T
  // positions (the ring brings the other ranks' keys), and each ring hop moves `hop_bytes`.
  int cp = 1, T_keys = 1;
  std::int64_t hop_bytes = 0;
  bool sequence_parallel = false, overlap = true, scores_materialized = true;
  std::map<std::string, int> stride;  // mesh dimension -> distance in ranks between neighbours of its groups
};

class StepRecorder final : public FsdpMemoryListener {
 public:
  explicit StepRecorder(Pricing p) : p_(std::move(p)) {}
  void on_memory(const FsdpMemoryEvent&) override {}
  void on_schedule(const FsdpScheduleEvent& e) override;

  std::vector<TimedOp> ops;
  double priced_flops = 0;  // forward and backward, recomputation excluded (the MFU convention)
  double model_flops = 0;   // the trainer's formula for the tokens priced
  std::map<std::string, std::string> link_of;
  std::map<std::string, double> bytes_of;  // per communicator: the payload issued (this rank's, per step)

 private:
  using Kind = FsdpScheduleEvent::Kind;
  double std_N() const { return static_cast<double>(p_.B) * p_.T; }
  std::int64_t N() const { return std::int64_t{p_.B} * p_.T; }
  void compute(double seconds, const std::string& what) { ops.push_back({TimedOp::Kind::compute, seconds, "", -1, what, {}}); }
  int issue(CollectiveOp op, std::int64_t bytes, int ranks, const std::string& group);
  void wait(int id) { ops.push_back({TimedOp::Kind::wait, 0, "", id, "", {}}); }
  void push_collective(double seconds, const std::string& stream, int id, bool spans_nodes) {
    ops.push_back({TimedOp::Kind::issue, seconds, stream, id, "",
                   (spans_nodes ? p_.machine->inter_node : p_.machine->intra_node).beside_compute});
  }
  double gemms_seconds(const std::vector<Gemm>& gemms) const;
  double elementwise_seconds(const Region& r, bool backward) const;
  // A unit's regions as forward runs them, or as backward's replay of forward does (`recompute`).
  std::vector<Region> regions_of(const Module& unit, bool recompute = false) const;
  // regions_of's pieces, one per kind of unit, and the block's steps.
  std::vector<Region> root_regions(const CausalLM& lm) const;
  std::vector<Region> routed_experts_regions(const RoutedExperts& experts) const;
  std::vector<Region> block_regions(const Module& unit, bool recompute) const;
  std::vector<Region> split_at_row_parallel(const Module& unit, const DecoderBlock* block, const Linear* skipped,
                                            std::int64_t routed_rows_per_expert, double& outputs) const;
  void close_last_region(std::vector<Region>& regions, double outputs, bool replay) const;
  void price_mlp_activation(Region& mlp, const DecoderBlock& block, std::int64_t routed_rows_per_expert) const;
  void tp_blocking(CollectiveOp op) { if (p_.tp > 1) wait(issue(op, N() * p_.C * 4, p_.tp, "tp")); }
  // Expert parallelism: a dispatch (the counts, the capacity verdicts, then the rows) or a combine (the rows), each
  // blocking, as ExpertParallelGroup issues them.
  void exchange_rows(const Region& r, bool with_counts);
  // Context parallelism: one hop of the ring (a block to rank + 1, one from rank - 1), asynchronous.
  int ring_hop();
  // Attention's products over the ring's cp steps, each step's hop issued before its share of the products and
  // waited after (forward); backward also passes each block's dk, dv partial sums on after the step.
  void ring_forward(double products_seconds, const std::string& what);
  void ring_backward(double products_seconds);
  void forward(const std::vector<Region>& regions, const std::string& what, bool count);
  // `deferred` set (zero_bubble's I): the weight-gradient GEMMs go there for the unit's Pass::backward_weight.
  void backward(const std::vector<Region>& regions, bool count, std::vector<Gemm>* deferred = nullptr);

  Pricing p_;
  // Per unit, oldest first: each pending I's weight-gradient GEMMs until its W (a stage may run several Is before
  // the first W; the Ws come in the Is' order).
  std::map<const Module*, std::deque<std::vector<Gemm>>> deferred_;
  int next_id_ = 1 << 24;  // ids for the collectives priced here (fully_shard's count up from 0)
};

int StepRecorder::issue(CollectiveOp op, std::int64_t bytes, int ranks, const std::string& group) {
  const int stride = p_.stride.count(group) ? p_.stride.at(group) : 1;
  const bool spans = group_spans_nodes(*p_.machine, 0, stride, ranks);
  if (ranks > 1) link_of[group] = spans ? "inter-node" : "intra-node";
  bytes_of[group] += static_cast<double>(bytes);
  const int id = next_id_++;
  push_collective(collective_seconds(*p_.machine, op, bytes, ranks, spans, group_ranks_per_node(*p_.machine, stride, ranks)),
                  group, id, spans);
  return id;
}

void StepRecorder::exchange_rows(const Region& r, bool with_counts) {
  if (r.exchanged_bytes == 0) return;
  if (with_counts) {
    wait(issue(CollectiveOp::all_to_all, std::int64_t{p_.experts} * 8, p_.ep, "ep"));  // E / ep counts per peer
    wait(issue(CollectiveOp::all_gather, 4 * 8, p_.ep, "ep"));                        // the capacity verdicts
  }
  wait(issue(CollectiveOp::all_to_all, r.exchanged_bytes, p_.ep, "ep"));
}

int StepRecorder::ring_hop() {
  const int stride = p_.stride.count("cp") ? p_.stride.at("cp") : 1;
  const bool spans = group_spans_nodes(*p_.machine, 0, stride, p_.cp);
  link_of["cp"] = spans ? "inter-node" : "intra-node";
  bytes_of["cp"] += static_cast<double>(p_.hop_bytes);
  const int id = next_id_++;
  // One peer each way: the link carries the block once, as a 2-rank all-gather of two blocks moves one.
  push_collective(collective_seconds(*p_.machine, CollectiveOp::all_to_all, 2 * p_.hop_bytes, 2, spans,
                                     group_ranks_per_node(*p_.machine, stride, p_.cp)),
                  "cp", id, spans);
  return id;
}

void StepRecorder::ring_forward(double products_seconds, const std::string& what) {
  for (int k = 0; k < p_.cp; ++k) {
    const int next = k + 1 < p_.cp ? ring_hop() : -1;
    compute(products_seconds / p_.cp, what);
    if (next >= 0) wait(next);
  }
}

void StepRecorder::ring_backward(double products_seconds) {
  int partial = -1;
  for (int k = 0; k < p_.cp; ++k) {
    const int next = k + 1 < p_.cp ? ring_hop() : -1;
    compute(products_seconds / (2 * p_.cp), "backward");  // dq
    if (partial >= 0) wait(partial);
    compute(products_seconds / (2 * p_.cp), "backward");  // dk, dv
    partial = ring_hop();
    if (next >= 0) wait(next);
  }
  wait(partial);
}

// The parameters a unit's own passes compute with: its own and those of descendants without a group of their own
// (a block's routed experts are its own under ep 1, a unit of their own under ep > 1).
void unit_parameters(const Module& unit, std::vector<const Parameter*>& out) {
  for (const Parameter* q : const_cast<Module&>(unit).local_parameters()) out.push_back(q);
  for (Module* child : unit.children())
    if (!fsdp_group(*child)) unit_parameters(*child, out);
}

double StepRecorder::gemms_seconds(const std::vector<Gemm>& gemms) const {
  double s = 0;
  for (const Gemm& g : gemms) s += gemm_seconds(*p_.machine, p_.precision, g.m, g.n, g.k, g.count);
  return s;
}

// A region's non-GEMM kernels in forward, or in backward (kBackwardBytesPerForwardByte times the forward's kernels
// and bytes), at the machine's bandwidth for that pass.
double StepRecorder::elementwise_seconds(const Region& r, bool backward) const {
  const double scale = backward ? kBackwardBytesPerForwardByte : 1;
  const double bytes = backward ? r.bytes - r.forward_only_bytes : r.bytes;
  double s = scale * r.kernels * p_.machine->kernel_overhead_us * 1e-6 +
             scale * bytes / (elementwise_bandwidth_gbs(*p_.machine, backward) * 1e9);
  for (const auto& [family, bytes] : r.family_bytes)
    s += scale * bytes / (elementwise_bandwidth_gbs(*p_.machine, backward, family) * 1e9);
  return s;
}

// A unit's own parameters priced as its passes use them. Blocks: every 2-D weight is a GEMM over the micro-batch's
// N rows with the TP-local shape, split into regions at each row-parallel weight (which ends a Megatron region);
// attention's products per region that holds the heads. The root: the LM head (the token embedding when tied),
// the final norm, lookups and the cross-entropy. A block's replay in backward stops before the layer
// DecoderBlock::recompute_stops_before() names: without its GEMM, output pass, tp reduction and residual add.
std::vector<Region> StepRecorder::regions_of(const Module& unit, bool recompute) const {
  if (const auto* lm = dynamic_cast<const CausalLM*>(&unit)) return root_regions(*lm);
  if (const auto* experts = dynamic_cast<const RoutedExperts*>(&unit)) return routed_experts_regions(*experts);
  return block_regions(unit, recompute);
}

// The root's one region: the LM head (the token embedding when tied), the final norm and the cross-entropy where
// this rank heads, the lookups where it embeds.
std::vector<Region> StepRecorder::root_regions(const CausalLM& lm) const {
  const double n = std_N(), C = p_.C;
  const double rows_outside = p_.sequence_parallel ? n / p_.tp : n;  // norms and residuals under sequence parallelism
  std::vector<Region> regions(1);
  Region& r = regions.front();
  // A pipeline rank's root runs the lookups before its first chunk and the head after its last only.
  const PipelineStagePart& part = lm.pipeline_stage();
  const bool embeds = part.embeds(lm.pipeline_chunk()), heads = part.heads(lm.pipeline_chunk());
  if (heads) {
    const Parameter& head = lm.lm_head ? *lm.lm_head : lm.token_embedding;  // tied: the embedding serves
    r.weights.push_back({N(), head.local_shape()[0], head.local_shape()[1]});
    const double v_local = static_cast<double>(head.local_shape()[0]);
    // Logits written, cross-entropy read, gradient written: the fused cross-entropy writes d(logits) in forward,
    // so backward makes no pass over the logits.
    r.forward_only_bytes = 4 * 3 * n * v_local;
    r.bytes = 4 * 4 * rows_outside * C + r.forward_only_bytes;  // final norm in and out, twice (stats)
    r.kernels = 4;
    for (const Parameter* q : const_cast<CausalLM&>(lm).local_parameters())
      if (q->local_shape().size() == 1) r.elementwise_flops += 2 * rows_outside * static_cast<double>(q->numel());
  }
  if (embeds) {
    r.bytes += 4 * 2 * n * C * (lm.position_table ? 2 : 1);  // lookups
    r.kernels += 2;
  }
  return regions;
}

// The routed experts' own unit (under ep): one region of grouped GEMMs and the rows its exchanges move.
std::vector<Region> StepRecorder::routed_experts_regions(const RoutedExperts& experts) const {
  // Under ep the rank's E / ep experts get the rows of the ep ranks routed to them: balanced, ep N k / E each,
  // N k rows in all, which each exchange moves (dispatch and combine in forward, their backwards in backward).
  std::vector<Region> regions(1);
  Region& r = regions.front();
  const std::int64_t rows = (std::int64_t{p_.ep} * N() * p_.top_k + p_.experts - 1) / p_.experts;
  const int L = experts.local_experts();
  double outputs = 0;
  for (const Parameter* q : const_cast<RoutedExperts&>(experts).local_parameters()) {
    const auto& e = q->local_shape();
    r.weights.push_back({rows, e[1], e[2], e[0]});
    outputs += static_cast<double>(rows * e[0] * e[1]);
  }
  const double elements = static_cast<double>(rows) * L * experts.gate.local_shape()[1];
  r.bytes = kPassBytesPerOutput * (outputs - 2 * elements);  // the down projection's pass; gate and up: swiglu's
  r.family_bytes["swiglu"] += kernel_family_bytes_per_element("swiglu") * elements;
  r.kernels = 3 * L + 2;
  r.exchanged_bytes = N() * p_.top_k * p_.C * 4;
  return regions;
}

// A block (or any other unit): its GEMMs split into Megatron regions, the last closed, the MLP's activation and
// attention's softmax priced by family.
std::vector<Region> StepRecorder::block_regions(const Module& unit, bool recompute) const {
  const auto* block = dynamic_cast<const DecoderBlock*>(&unit);
  const MoeFeedForward* moe = block ? block->moe() : nullptr;
  // A sparse block's experts: a grouped GEMM of N k routed rows, priced as E GEMMs of N k / E rows (balanced).
  const std::int64_t routed_rows_per_expert = moe ? (N() * moe->top_k() + moe->num_experts() - 1) / moe->num_experts() : 0;
  const Linear* skipped = recompute && block ? block->recompute_stops_before() : nullptr;
  double outputs = 0;  // elements the last region's GEMMs write: each gets a pass (kPassBytesPerOutput)
  std::vector<Region> regions = split_at_row_parallel(unit, block, skipped, routed_rows_per_expert, outputs);
  close_last_region(regions, outputs, skipped != nullptr);
  if (block) price_mlp_activation(regions.back(), *block, routed_rows_per_expert);
  // The softmax over B x heads x T x T scores, unless the fused kernel keeps them on chip.
  const int local_heads = std::max(1, p_.n_head / p_.tp);
  if (p_.scores_materialized)
    regions.front().family_bytes["softmax"] += kernel_family_bytes_per_element("softmax") * double(p_.B) * local_heads * p_.T * p_.T;
  regions.front().kernels += 3;
  return regions;
}

// The unit's parameters in order, a region ending at each row-parallel weight; `outputs` comes back as the elements
// the still-open last region's GEMMs write. A replay (`skipped`) leaves out the layer it stops before.
std::vector<Region> StepRecorder::split_at_row_parallel(const Module& unit, const DecoderBlock* block, const Linear* skipped,
                                                        std::int64_t routed_rows_per_expert, double& outputs) const {
  const double n = std_N(), C = p_.C;
  const double rows_outside = p_.sequence_parallel ? n / p_.tp : n;  // norms and residuals under sequence parallelism
  const int local_heads = std::max(1, p_.n_head / p_.tp);
  const std::int64_t head_size = block ? block->local().head_size : p_.C / p_.n_head;
  std::vector<Region> regions(1);
  outputs = 0;
  bool products_placed = false;
  std::vector<const Parameter*> params;
  unit_parameters(unit, params);
  for (const Parameter* q : params) {
    Region& r = regions.back();
    if (skipped && (q == &skipped->weight || q == skipped->bias)) continue;
    if (q->local_shape().size() == 1) {
      r.elementwise_flops += 2 * rows_outside * static_cast<double>(q->numel());
      continue;
    }
    if (q->local_shape().size() == 3) {  // stacked experts (E, out, in)
      const auto& e = q->local_shape();
      r.weights.push_back({routed_rows_per_expert, e[1], e[2], e[0]});
      outputs += static_cast<double>(routed_rows_per_expert * e[0] * e[1]);
      continue;
    }
    r.weights.push_back({N(), q->local_shape()[0], q->local_shape()[1]});
    outputs += n * static_cast<double>(q->local_shape()[0]);
    const bool row_parallel = q->tensor_parallel() && q->tensor_parallel()->dim == 1;
    if (!products_placed) {  // the first weight is attention's input projection: its region holds the products
      // this rank's queries against every key (under cp the ring brings the others' keys)
      r.products.push_back({p_.T, p_.T_keys, head_size, std::int64_t{p_.B} * local_heads});  // q k^T
      r.products.push_back({p_.T, head_size, p_.T_keys, std::int64_t{p_.B} * local_heads});  // p v
      products_placed = true;
    }
    if (row_parallel) {
      // The region ends here; the elementwise traffic of what it computed goes with it.
      r.bytes += kPassBytesPerOutput * outputs + (kNormBytesPerElement + kResidualBytesPerElement) * rows_outside * C;
      r.kernels += static_cast<int>(r.weights.size()) + 4;
      outputs = 0;
      regions.emplace_back();
    }
  }
  return regions;
}

// The last region gets its GEMMs' passes; with no row-parallel weight (tp 1) it also holds both norms and residual
// adds; a replay (`replay`) ends without the residual add and (tp) without the output's reduction.
void StepRecorder::close_last_region(std::vector<Region>& regions, double outputs, bool replay) const {
  const double n = std_N(), C = p_.C;
  const double rows_outside = p_.sequence_parallel ? n / p_.tp : n;  // norms and residuals under sequence parallelism
  if (regions.back().weights.empty() && regions.size() > 1) regions.pop_back();
  Region& last = regions.back();
  last.bytes += kPassBytesPerOutput * outputs;
  last.kernels += outputs > 0 ? 2 : 0;
  if (regions.size() == 1) {  // no row-parallel weight (tp 1): attention's and the MLP's norms and residual adds
    last.bytes += 2 * (kNormBytesPerElement + kResidualBytesPerElement) * rows_outside * C;
    last.kernels += static_cast<int>(last.weights.size()) + 8;
  }
  if (replay) {  // the replay has no residual add at the end, and (tp) no reduction of the output
    if (p_.tp > 1) {  // the MLP's region was not closed by its row-parallel weight: its norm, no residual add
      last.bytes += kNormBytesPerElement * rows_outside * C;
      last.kernels += static_cast<int>(last.weights.size()) + 2;
    } else {
      last.bytes -= kResidualBytesPerElement * rows_outside * C;
      last.kernels -= 2;
    }
    last.reduces_output = false;
  }
}

// The MLP's activation is its own kernel family, in place of the pass each of its input branches got above.
// A sparse block's: over the N k routed rows of F_e, after its gate and up projections; its routed rows are
// gathered (read and written), combined (read) and the router's probabilities written and read.
// (Under ep the experts' unit prices their activation; the block keeps the router, the gather and the combine.)
void StepRecorder::price_mlp_activation(Region& mlp, const DecoderBlock& block, std::int64_t routed_rows_per_expert) const {
  const double n = std_N(), C = p_.C;
  const MoeFeedForward* moe = block.moe();
  const bool experts_here = moe && !fsdp_group(const_cast<RoutedExperts&>(moe->experts));  // else their own unit
  const double elements = moe ? static_cast<double>(routed_rows_per_expert * moe->num_experts() * moe->ffn_hidden())
                              : n * block.local().mlp_width;
  const std::string family = block.mlp_activation_name();
  if (!moe || experts_here) {
    mlp.bytes -= kPassBytesPerOutput * elements * static_cast<double>(moe ? 2 : block.parts().mlp_in.size());
    mlp.family_bytes[family] += kernel_family_bytes_per_element(family) * elements;
  }
  if (moe) {
    const double routed = static_cast<double>(routed_rows_per_expert * moe->num_experts());
    mlp.bytes += 4 * (3 * routed * C + 2 * n * moe->num_experts());
    mlp.kernels += 4 + moe->num_experts();
  }
}

// Forward: each region's GEMMs and elementwise kernels, then (tp) its output reduced, blocking.
void StepRecorder::forward(const std::vector<Region>& regions, const std::string& what, bool count) {
  for (const Region& r : regions) {
    if (p_.sequence_parallel) tp_blocking(CollectiveOp::all_gather);
    exchange_rows(r, true);  // dispatch
    if (p_.cp > 1 && !r.products.empty()) {
      compute(gemms_seconds(r.weights) + elementwise_seconds(r, false), what);
      ring_forward(gemms_seconds(r.products), what);
    } else {
      compute(gemms_seconds(r.weights) + gemms_seconds(r.products) + elementwise_seconds(r, false), what);
    }
    exchange_rows(r, false);  // combine
    if (r.reduces_output) tp_blocking(p_.sequence_parallel ? CollectiveOp::reduce_scatter : CollectiveOp::all_reduce);
    if (!count) continue;
    for (const Gemm& g : r.weights) priced_flops += g.flops();
    for (const Gemm& g : r.products) priced_flops += g.flops();
    priced_flops += r.elementwise_flops;
  }
}

// Backward, regions in reverse: dX GEMMs (and the products'), then (tp) the region input's gradient reduction
// issued, the dW GEMMs under it (comm.overlap), and waited for.
void StepRecorder::backward(const std::vector<Region>& regions, bool count, std::vector<Gemm>* deferred) {
  for (auto it = regions.rbegin(); it != regions.rend(); ++it) {
    const Region& r = *it;
    if (p_.sequence_parallel) tp_blocking(CollectiveOp::all_gather);
    std::vector<Gemm> dx, dw;
    for (const Gemm& g : r.weights) {
      dx.push_back({g.m, g.k, g.n, g.count});
      dw.push_back({g.n, g.k, g.m, g.count});
    }
    std::vector<Gemm> products;
    for (const Gemm& g : r.products) products.push_back(g), products.push_back(g);
    exchange_rows(r, false);  // combine's backward brings the outputs' gradients to the experts
    if (p_.cp > 1 && !products.empty()) {
      compute(gemms_seconds(dx) + elementwise_seconds(r, true), "backward");
      ring_backward(gemms_seconds(products));
    } else {
      compute(gemms_seconds(dx) + gemms_seconds(products) + elementwise_seconds(r, true), "backward");
    }
    dx.insert(dx.end(), products.begin(), products.end());  // for the FLOP count below
    int reduction = -1;
    if (p_.tp > 1) {
      reduction = issue(p_.sequence_parallel ? CollectiveOp::reduce_scatter : CollectiveOp::all_reduce,
                        N() * p_.C * 4, p_.tp, "tp");
      if (!p_.overlap) wait(reduction);
    }
    if (deferred) deferred->insert(deferred->end(), dw.begin(), dw.end());
    else compute(gemms_seconds(dw), "backward");
    exchange_rows(r, false);  // dispatch's backward takes the inputs' gradients home
    if (reduction >= 0 && p_.overlap) wait(reduction);
    if (!count) continue;
    for (const Gemm& g : dx) priced_flops += g.flops();
    if (!deferred)
      for (const Gemm& g : dw) priced_flops += g.flops();
    priced_flops += 2 * r.elementwise_flops;
  }
}

void StepRecorder::on_schedule(const FsdpScheduleEvent& e) {
  switch (e.kind) {
    case Kind::pass_end:
      if (e.pass == Pass::forward) forward(regions_of(*e.module), "forward", true);
      if (e.pass == Pass::forward && !e.module->parent())
        if (const auto* lm = dynamic_cast<const LanguageModel*>(e.module))
          model_flops += lm->flops_per_token(p_.T_keys) * std_N() / p_.tp;
      break;
    case Kind::pass_begin:
      if (e.pass == Pass::backward_weight) {  // what the unit's I left: its weight-gradient GEMMs, now
        std::deque<std::vector<Gemm>>& pending = deferred_[e.module];
        FSDPP_CHECK(!pending.empty(), "step pricing: a weight pass of {} without its I", e.module->path());
        const std::vector<Gemm> dw = std::move(pending.front());
        pending.pop_front();
        compute(gemms_seconds(dw), "backward_weight");
        for (const Gemm& g : dw) priced_flops += g.flops();
        break;
      }
      if (e.pass != Pass::backward) break;
      // Activation checkpointing: the forward runs again first, up to the block's output projection (its TP
      // collectives too, not its all-gather).
      if (e.module->recomputes_in_backward()) forward(regions_of(*e.module, true), "recompute", false);
      if (e.defers_weight_gradients) deferred_[e.module].emplace_back();
      backward(regions_of(*e.module), true, e.defers_weight_gradients ? &deferred_[e.module].back() : nullptr);
      break;
    case Kind::issue: {
      const int stride = p_.stride.count(e.group) ? p_.stride.at(e.group) : 1;
      const bool spans = group_spans_nodes(*p_.machine, 0, stride, e.ranks);
      if (e.ranks > 1) link_of[e.group] = spans ? "inter-node" : "intra-node";
      bytes_of[e.group] += static_cast<double>(e.bytes);
      const int per_node = group_ranks_per_node(*p_.machine, stride, e.ranks);
      push_collective(collective_seconds(*p_.machine, e.op, e.bytes, e.ranks, spans, per_node), e.group, e.id, spans);
      break;
    }
    case Kind::wait: wait(e.id); break;
    case Kind::kernel: compute(kernel_seconds(*p_.machine, static_cast<double>(e.bytes)), "copies"); break;
    case Kind::host_copy: {
      const int id = next_id_++;
      ops.push_back({TimedOp::Kind::issue, host_copy_seconds(*p_.machine, e.bytes), "host_link", id, "", {}});
      wait(id);  // fully_shard fences the offload stream at once
      link_of["host_link"] = "host link";
      break;
    }
  }
}

// The optimizer step over this rank's shards: optimizer_passes over every element, and eight kernel launches per
// unit.
double optimizer_seconds(const Deck& deck, const MemoryPlan& plan, const Machine& m) {
  const double numel = static_cast<double>(plan.memory.parameters) / 4;
  std::int64_t units = 0;
  for (const PlannedUnit& u : plan.units) units += u.parameters > 0 ? 1 : 0;
  const double bandwidth = m.optimizer_bandwidth_gbs > 0 ? m.optimizer_bandwidth_gbs : m.memory_bandwidth_gbs;
  return 2 * units * 4 * m.kernel_overhead_us * 1e-6 + optimizer_passes(deck.optim) * 4 * numel / (bandwidth * 1e9);
}

Pricing pricing_for(const Deck& deck, const Machine& machine) {
  Pricing p;
  p.machine = &machine;
  p.precision = std::string(gemm_precision_name(resolved_gemm_precision(deck)));
  p.B = deck.train.micro_batch;
  FSDPP_CHECK(p.B > 0, "plan_step: the deck's train.micro_batch is {}; resolve the deck first", p.B);
  p.cp = std::max(1, deck.mesh.cp);
  p.T_keys = deck.model.context_length;
  p.T = deck.model.context_length / p.cp;
  p.C = deck.model.n_embd;
  p.n_head = deck.model.n_head;
  p.tp = std::max(1, deck.mesh.tp);
  p.sequence_parallel = deck.mesh.tp_sequence_parallel && p.tp > 1;
  p.overlap = deck.comm.overlap;
  p.experts = deck.model.moe.num_experts;
  p.top_k = deck.model.moe.top_k;
  p.ep = std::max(1, deck.mesh.ep);
  // automatic is what the kernels of the machine would run: the presets are GPU nodes, where it means fused; a
  // calibrated description is the machine at hand, where it means what this build runs.
  const AttentionKind attention = deck.model.attention == AttentionKind::automatic && machine.source == "spec-sheet"
                                      ? AttentionKind::fused : resolve_attention(deck.model.attention);
  p.scores_materialized = attention != AttentionKind::fused && p.cp == 1;  // the ring runs the fused kernels
  if (p.cp > 1) {
    p.hop_bytes = ContextParallelGroup::hop_bytes(p.B, p.T, ContextParallelGroup::kv_width_of(deck.model, p.tp));
  }
  return p;
}



}  // namespace

// One dry step priced: `run` plans its memory with the recorder listening (the whole job's, or a pipeline stage's).
StepPlan price_step(const Deck& deck, int ranks, const Machine& machine,
                    const std::function<MemoryPlan(std::shared_ptr<FsdpMemoryListener>)>& run) {
  Pricing pricing = pricing_for(deck, machine);
  // The mesh is known once the planner resolved it; the strides follow from its row-major order (tp innermost).
  const MemoryPlan shape = plan_model_states(deck, ranks);
  int stride = 1;
  for (const MeshDim& d : shape.mesh)
    if (d.name == "tp") pricing.tp = d.size;  // as resolved for this launch
  for (auto d = shape.mesh.rbegin(); d != shape.mesh.rend(); ++d) {
    pricing.stride[d->name] = stride;
    if (d->name == "dp_shard") pricing.stride["post_forward"] = stride;  // k consecutive ranks of a shard group
    if (d->name == "dp_shard") pricing.stride["ep"] = stride;  // ep consecutive ranks of a shard group
    stride *= std::max(1, d->size);
  }
  auto recorder = std::make_shared<StepRecorder>(pricing);
  StepPlan out;
  out.memory = run(recorder);
  std::vector<TimedOp> ops = recorder->ops;
  ops.push_back({TimedOp::Kind::compute, optimizer_seconds(deck, out.memory, machine), "", -1, "optimizer", {}});
  const SimulatedStep sim = simulate(ops);

  StepTime& t = out.time;
  t.machine = machine.name;
  t.precision = pricing.precision;
  t.peak_tflops = gemm_curve(machine, t.precision).peak_tflops;
  t.ms_per_step = sim.seconds * 1e3;
  t.compute_ms = sim.compute_s * 1e3;
  for (const auto& [stream, s] : sim.busy_s) t.busy_comm_ms[stream] = s * 1e3, t.comm_ms += s * 1e3;
  for (const auto& [stream, s] : sim.exposed_s) t.exposed_comm_ms[stream] = s * 1e3;
  for (const auto& [what, s] : sim.compute_by_what) t.compute_ms_by_what[what] = s * 1e3;
  t.link_of = recorder->link_of;
  t.comm_bytes = recorder->bytes_of;
  const std::string critical = sim.critical_resource();
  t.critical_resource = critical == "compute" || !t.link_of.count(critical)
                            ? critical : fmt::format("{} ({})", critical, t.link_of.at(critical));
  const double tokens = static_cast<double>(deck.train.global_batch) * deck.model.context_length;
  t.tokens_per_s = sim.seconds > 0 ? tokens / sim.seconds : 0;
  t.tokens_per_s_per_device = t.tokens_per_s / ranks;
  t.model_flops_per_rank = recorder->model_flops;
  t.priced_flops_per_rank = recorder->priced_flops;
  t.mfu = sim.seconds > 0 ? mfu(t.model_flops_per_rank / sim.seconds, t.peak_tflops * 1e12) : 0;
  return out;
}

StepPlan plan_step(const Deck& deck, int ranks, const Machine& machine) {
  FSDPP_REQUIRE(deck.mesh.pp == 1, "mesh.pp is {}: a pipeline's step is priced per stage (plan_pipeline_step)",
                deck.mesh.pp);
  return price_step(deck, ranks, machine, [&](std::shared_ptr<FsdpMemoryListener> recorder) {
    return plan_memory(deck, ranks, std::move(recorder));
  });
}

std::string format_step_time(const StepTime& t) {
  std::string out;
  auto line = [&out](const std::string& s) { out += s + "\n"; };
  line(fmt::format("Predicted time on {} ({} GEMMs, peak {:.1f} TFLOP/s per device):", t.machine, t.precision,
                   t.peak_tflops));
  line(fmt::format("  {:<40} {:>12.2f}", "ms per step", t.ms_per_step));
  line(fmt::format("  {:<40} {:>12.0f}", "tokens/s per device", t.tokens_per_s_per_device));
  line(fmt::format("  {:<40} {:>12.0f}", "tokens/s, all devices", t.tokens_per_s));
  line(fmt::format("  {:<40} {:>12.3f}", "MFU (model FLOPs over the peak)", t.mfu));
  std::string parts;
  for (const auto& [what, ms] : t.compute_ms_by_what) parts += fmt::format("{}{} {:.2f}", parts.empty() ? "" : ", ", what, ms);
  line(fmt::format("  {:<40} {:>12.2f}   ({})", "compute ms", t.compute_ms, parts));
  for (const auto& [dim, ms] : t.busy_comm_ms) {
    const double exposed = t.exposed_comm_ms.count(dim) ? t.exposed_comm_ms.at(dim) : 0.0;
    const double mib = t.comm_bytes.count(dim) ? t.comm_bytes.at(dim) / 1048576.0 : 0.0;
    line(fmt::format("  {:<40} {:>12.2f}   exposed {:.2f}, {:.2f} MiB issued", fmt::format("communication ms, {} ({})",
                     dim, t.link_of.count(dim) ? t.link_of.at(dim) : "one rank"), ms, exposed, mib));
  }
  line(fmt::format("  critical resource: {}", t.critical_resource));
  return out;
}

}  // namespace fsdpp
