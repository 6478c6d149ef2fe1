#pragma once
// The mixture-of-experts feed-forward of qwen3_moe and mixtral blocks (Switch / GShard / Mixtral routing with
// Hugging Face's exact choices), forward and backward side by side:
//
//   logits = x Wr^T                         Wr: router (E, C)         x (N, C): the block's normed rows
//   p      = softmax(logits)                                             (N, E)
//   top-k of p (+ bias under balance: bias), weights w = those p (/ their sum under norm_topk_prob)    (N, k)
//   route:  the (token, choice) pairs sorted by expert (stable: token order inside an expert), R <= N k rows
//   xs     = x[token of each slot]                                      (R, C)
//   for each expert e, its rows [o_e, o_e + n_e):                       grouped GEMMs, no copies
//     g = xs We_gate^T, u = xs We_up^T   (n_e, F)     We_gate, We_up: (E, F, C) stacked, expert e at e F C
//     h = silu(g) * u                    (n_e, F)
//     ys = h We_down^T                   (n_e, C)     We_down: (E, C, F)
//   out[t] = sum_j w[t, j] ys[slot(t, j)]                                (N, C)
//
// Dropless by default: every pair is routed. model.moe.capacity_factor c > 0 keeps at most ceil(c N k / E) rows
// per expert (the first by token order) and counts the rest as dropped; a dropped pair adds nothing.
//
// The route is computed on the host from the (N, k) expert ids (one small device-to-host copy per layer, as
// Megatron's grouped GEMM reads its per-expert counts on the host): the counting sort fixes the slot order, the
// counts bound the grouped GEMM's loop, and they are what expert parallelism exchanges first. Buffers are sized
// for the worst case, N k rows, so a step allocates nothing however the router routes.
//
// Load balancing (model.moe.balance): aux_loss adds aux_loss_coef x transformers' load_balancing_loss_func over
// all sparse layers of a forward (RouterStatistics); bias is DeepSeek-V3's aux-loss-free balancing (routing_bias,
// moved after each step by balance_load: no loss, no gradient); none adds nothing.
// router_z_loss_coef adds ST-MoE's z-loss, mean over routed rows of logsumexp(logits)^2.
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/buffers.hpp"
#include "fsdpp/nn/module.hpp"

#include <memory>
#include <string>
#include <vector>

namespace fsdpp {

// What the router did in one training forward, over every sparse layer, and the balancing losses it gives. The
// layers record into it during the model's forward; finish() totals them before the first backward reads the
// gradient. Like the cross-entropy, the losses are those of the forward's own rows (one micro-batch of one rank,
// as transformers computes them for the batch it is given): a deck's micro_batch fixes which rows share a loss,
// so the training does not depend on the rank count.
// Per layer, the busiest expert's tokens over the mean, of (layers, E) token counts per expert; 0 for a layer that
// routed nothing.
std::vector<double> expert_load_per_layer(const std::vector<double>& selections, int layers);

class ContextParallelGroup;

class RouterStatistics {
 public:
  RouterStatistics(const MoeConfig& config, int sparse_layers);

  void begin();  // a training forward starts
  // Sparse layer `layer` (0-based among the sparse ones) routed `rows` rows: per expert its top-k selections,
  // the sum of its probabilities, and the sum of the rows' logsumexp^2.
  void record(int layer, const std::vector<std::int64_t>& selections, const std::vector<double>& probability_sums,
              double lse_squared_sum, std::int64_t rows, std::int64_t dropped);
  // Totals the forward: the losses, and d(loss)/d(p_e) of every routed row (aux_grad) and the z-loss scale, for
  // a loss whose gradient is scaled by `loss_scale` (the micro-batch's share, Flow::loss_scale). Under context
  // parallelism (`cp` active) the sequences are split over the cp ranks: the losses are the whole sequences', from
  // the statistics summed over cp, and each rank's gradient is its rows' share of them (selections() stays this
  // rank's own).
  void finish(float loss_scale, ContextParallelGroup* cp = nullptr);

  double aux_loss() const { return aux_loss_; }  // transformers' load_balancing_loss_func, before its coefficient
  double z_loss() const { return z_loss_; }
  double weighted_loss() const;  // aux_loss_coef x aux + router_z_loss_coef x z: what the training loss adds
  const View1<float>& aux_grad() const { return aux_grad_; }  // (E); empty unless balance is aux_loss
  float z_scale() const { return z_scale_; }
  const std::vector<std::int64_t>& selections() const { return selections_; }  // (layers, E), totalled
  int layers() const { return layers_; }
  std::int64_t dropped() const { return dropped_; }  // (token, choice) pairs a capacity dropped, all layers

  // Pipeline parallelism (train/pipeline_step.hpp): a stage routes only its own layers, but the losses are over
  // every layer. What has been recorded so far travels with the residual stream as state() (doubles: the counts
  // are exact in them), which the next stage restore()s and records on; the last stage finishes the totals, and
  // they go back with the output gradient so that each stage finishes them too before its backward. The losses
  // are then those of one unbroken forward, bit for bit: each layer's row of the arrays is its own, and the
  // logsumexp sum is added to in layer order.
  std::size_t state_size() const { return 2 * selections_.size() + 4; }
  void state(std::vector<double>& out) const;  // resized to state_size()
  void restore(const std::vector<double>& state);

 private:
  MoeConfig config_;
  int layers_;
  std::vector<std::int64_t> selections_;  // (layers, E)
  std::vector<double> probability_sums_;  // (layers, E)
  double lse_squared_sum_ = 0;
  std::int64_t rows_ = 0, dropped_ = 0;
  double aux_loss_ = 0, z_loss_ = 0;
  float z_scale_ = 0;
  View1<float> aux_grad_;
  bool recorded_ = false;
};

// model.moe.capacity_factor c over `pairs` (token, choice) pairs of one forward: at most ceil(c pairs / E) rows
// per expert; 0 when c is 0 (dropless).
std::int64_t expert_capacity_rows(double capacity_factor, std::int64_t pairs, int experts);

// Parameter names: Qwen3-MoE's "mlp.gate.weight", "mlp.experts.gate_proj.weight", ...; Mixtral's
// "block_sparse_moe.gate.weight", "block_sparse_moe.experts.w1.weight" (w1 gate, w3 up, w2 down).
struct MoeNames {
  std::string prefix, router, gate, up, down;
  static MoeNames qwen3_moe() { return {"mlp.", "gate", "gate_proj", "up_proj", "down_proj"}; }
  static MoeNames mixtral() { return {"block_sparse_moe.", "gate", "w1", "w3", "w2"}; }
};

// The routed rows' buffers (table()), for N token rows. Forward's (kept for backward, or rebuilt by a block that
// recomputes) and backward's scratch are separate tables so the planner counts them as the blocks' are. Under
// expert parallelism the experts compute on the rows they received (xr, yr: up to the group's worst case), and
// gate/up/h are sized for those; otherwise on the routed rows themselves (xs, ys).
class MoeFeedForward;
struct MoeActivations {
  View1<float> logits, probs, lse, weights, xs, ys, xr, yr, gate, up, h;
  View1<std::int32_t> selected, slot_token, slot_pair, token_slot;
  Buffers buffers{Growth::grow_only};

  void ensure(const std::string& label, const MoeFeedForward& moe, int N);
  std::int64_t bytes() const { return buffers.bytes(); }
};
struct MoeScratch {
  View1<float> dys, dyr, dweights, dh, dgate, dup, dxr, dxs, dlogits, probability_sums;
  Buffers buffers{Growth::exact};
};

// The routed experts of a sparse layer: the stacked SwiGLU weights, a Module of their own (torchtitan's
// moe.experts) so that under expert parallelism fully_shard gives them their own group, on the ranks that hold
// the same experts. With mesh.ep > 1 a rank holds experts [first, first + E/ep): their parameters are Shard(0)
// over ep (Parameter::set_tensor_parallel with mesh_dim "ep"), local shape (E/ep, F, C).
//
// Its passes compute on the rows the layer binds, in blocks of one local expert's contiguous rows (one block per
// expert; under reproducible mode with ep, one per expert and source rank: the GEMMs of exactly the rows the
// source rank would have multiplied itself under ep 1), not on the residual stream. In forward the flow's x is the input rows (the output rows after);
// in backward dx is the output rows' gradient (the input rows' after). Going through the Module door is what
// runs fully_shard's hooks: the all-gather before each pass, the reduce-scatter after backward.
class RoutedExperts : public Module {
 public:
  RoutedExperts(const ModelConfig& config, const MoeNames& names, float std, float down_std);

  Parameter& gate;  // (E, F, C); this rank's (E/ep, F, C)
  Parameter& up;    // (E, F, C)
  Parameter& down;  // (E, C, F)

  // Rows [first, first + rows) of the bound buffers belong to local expert `expert`.
  struct RowBlock {
    int expert = 0;
    std::int64_t first = 0, rows = 0;
  };
  // What the next pass computes on, set by the layer before calling (*this)(flow, pass).
  struct Batch {
    const std::vector<RowBlock>* blocks = nullptr;  // the rows of this pass, in order
    View1<float> x;                // (rows, C): the input rows (what forward's flow.x is)
    View1<float> gate, up, h, y;   // forward: (rows, F) x 3 kept for backward, and the output (rows, C)
    View1<float> dgate, dup, dh, dx;  // backward's scratch, and the input rows' gradient (rows, C)
  };
  void bind(const Batch& batch) { batch_ = batch; }
  int local_experts() const { return static_cast<int>(gate.rows()); }

 protected:
  void forward(Flow& flow) override;
  void backward(Flow& flow) override;

 private:
  template <class F> void for_each_block(const F& f) const;  // f(local expert, first row, rows) with rows > 0
  template <class F> void for_each_span(const F& f) const;   // f(first row, rows): the blocks' contiguous spans
  std::int64_t end_row() const;                              // one past the blocks' last row
  int C_, F_;
  Batch batch_;
};

class ExpertParallelGroup;
struct ExpertRouting;

class MoeFeedForward {
 public:
  // Registers the router on `owner` and makes the experts, a module the owner adds as its child `names.prefix +
  // "experts"` (init: router and gate/up normal(std), down normal(down_std), as the dense MLP's projections).
  MoeFeedForward(Module& owner, const ModelConfig& config, const MoeNames& names, float std, float down_std);
  ~MoeFeedForward();

  Parameter& router;       // (E, C)
  RoutedExperts experts;   // gate, up (E, F, C), down (E, C, F)
  // balance: bias (DeepSeek-V3's "e_score_correction_bias", next to the router): (E), added to the routing
  // probabilities for the choice of the top k only, never to the combine weights; not trained, moved by
  // balance_load after each step. nullptr under the other balances.
  Parameter* routing_bias = nullptr;

  // balance: bias, after the optimizer step: b_e += rate * sign(mean - tokens[e]), `tokens` (E) the step's tokens
  // per expert over every rank (the same on every rank, so every rank moves its shard of b alike).
  void balance_load(const double* tokens, double rate);

  // Expert parallelism, on meta before fully_shard: this rank keeps its E / group.ranks() experts, and every
  // forward dispatches the routed rows to their experts' ranks and combines the results (nn/expert_parallel.hpp).
  // `label`: the layer, for errors ("layers.3.mlp"). `per_source` (reproducible mode): the experts multiply each
  // source rank's rows apart, and their backward runs once per source rank, so that each gradient piece is the one
  // that source's own rank computes under ep 1 and reaches fully_shard's exact reduction on its own.
  void use_expert_parallel(ExpertParallelGroup& group, const std::string& label, bool per_source = false);
  const ExpertParallelGroup* expert_parallel() const { return ep_; }

  int num_experts() const { return E_; }
  int top_k() const { return k_; }
  int ffn_hidden() const { return F_; }
  // Rows this rank's experts may compute on in a forward of N rows: N k, or the group's worst case under ep.
  std::int64_t expert_rows_capacity(int N) const;
  BufferTable activation_table(MoeActivations& a, int N) const;
  BufferTable scratch_table(MoeScratch& s, int N) const;
  // Statistics are recorded into `stats` as sparse layer `layer` (nullptr: not recorded, as in a recomputation,
  // an evaluation or a decode forward).
  void forward(const View1<float>& out, const View1<float>& x, int N, MoeActivations& a, MoeScratch& s,
               RouterStatistics* stats, int layer);
  // dx += d(out)/d(x) dout; every parameter's gradient +=. `stats`: the balancing losses' gradients (nullptr: none).
  void backward(const View1<float>& dx, const View1<float>& dout, const View1<float>& x, int N, MoeActivations& a,
                MoeScratch& s, const RouterStatistics* stats, float loss_scale);
  // Rows each (global) expert got from this rank in the last forward (after drops), and the pairs dropped.
  const std::vector<std::int64_t>& expert_rows() const { return counts_; }
  std::int64_t dropped() const { return dropped_; }

  // What a forward leaves for its backward besides its activation table: the route's row blocks and, under ep,
  // the exchange's routing. A pipeline stage keeps one per micro-batch in flight (the block's activation slots,
  // decoder_block.hpp): swap_forward_state exchanges the layer's with `other` (an empty one the first time: the
  // slot's first forward makes its routing).
  struct ForwardState {
    ForwardState();
    ~ForwardState();
    ForwardState(ForwardState&&) noexcept;
    ForwardState& operator=(ForwardState&&) noexcept;
    std::int64_t routed = 0;
    std::vector<RoutedExperts::RowBlock> blocks;
    std::vector<std::vector<RoutedExperts::RowBlock>> by_source;
    std::unique_ptr<ExpertRouting> routing;
  };
  void swap_forward_state(ForwardState& other);

 private:
  // The counting sort of the (N, k) choices by expert into the slot tables (host, then to the device).
  void route(MoeActivations& a, int N);
  RoutedExperts::Batch batch(MoeActivations& a, MoeScratch& s) const;

  int C_, E_, k_, F_;
  bool normalize_;
  double capacity_factor_;
  MoeBalance balance_;
  std::vector<std::int64_t> counts_, offsets_;
  std::int64_t routed_ = 0, dropped_ = 0;
  HostView1<std::int32_t> host_selected_, host_slot_token_, host_slot_pair_, host_token_slot_;
  // Expert parallelism: the group, this layer's routing, the per-expert counts on the device (what dispatch
  // exchanges), and the rows each local expert received.
  ExpertParallelGroup* ep_ = nullptr;
  std::string ep_label_;  // the layer, for a slot's routing
  std::unique_ptr<ExpertRouting> routing_;
  View1<std::int64_t> counts_device_;
  HostView1<std::int64_t> counts_host_;
  bool per_source_ = false;
  std::vector<RoutedExperts::RowBlock> blocks_;                 // the last forward's, in row order
  std::vector<std::vector<RoutedExperts::RowBlock>> by_source_;  // per_source_: blocks_ of each source rank
  void make_blocks();
};

}  // namespace fsdpp
