#include "fsdpp/nn/moe.hpp"

#include "fsdpp/nn/context_parallel.hpp"

#include "fsdpp/nn/expert_parallel.hpp"

#include "fsdpp/nn/kernels/linear.hpp"
#include "fsdpp/nn/kernels/moe.hpp"
#include "fsdpp/nn/kernels/swiglu.hpp"
#include "fsdpp/runtime/error.hpp"

#include <algorithm>
#include <cmath>

namespace fsdpp {

using namespace kernels;

// ---------------------------------------------------------------------------------------------------------
// RouterStatistics

RouterStatistics::RouterStatistics(const MoeConfig& config, int sparse_layers)
    : config_(config),
      layers_(sparse_layers),
      selections_(sz(std::int64_t{sparse_layers} * config.num_experts)),
      probability_sums_(selections_.size()) {}  // aux_grad_ at the first finish(): models are built on meta

void RouterStatistics::begin() {
  std::fill(selections_.begin(), selections_.end(), 0);
  std::fill(probability_sums_.begin(), probability_sums_.end(), 0.0);
  lse_squared_sum_ = 0;
  rows_ = 0;
  dropped_ = 0;
  recorded_ = false;
}

void RouterStatistics::record(int layer, const std::vector<std::int64_t>& selections,
                              const std::vector<double>& probability_sums, double lse_squared_sum, std::int64_t rows,
                              std::int64_t dropped) {
  const int E = config_.num_experts;
  for (int e = 0; e < E; ++e) {
    selections_[sz(std::int64_t{layer} * E + e)] = selections[sz(e)];
    probability_sums_[sz(std::int64_t{layer} * E + e)] = probability_sums[sz(e)];
  }
  lse_squared_sum_ += lse_squared_sum;
  rows_ += rows;
  dropped_ += dropped;
  recorded_ = true;
}

// transformers' load_balancing_loss_func over the concatenated layers (R rows in all): f_e = selections of e / R,
// P_e = probability sum of e / R, aux = E sum_e f_e P_e. Its gradient goes through P only: d aux / d p(row, e) =
// E f_e / R, scaled as the cross-entropy's is (loss_scale: the micro-batch's share of the step's loss). The z-loss
// mean(lse^2) gives d / d lse(row) = 2 lse / R.
void RouterStatistics::finish(float loss_scale, ContextParallelGroup* cp) {
  if (!recorded_) return;
  const int E = config_.num_experts;
  // The forward's sums (layers x E selections, layers x E probability sums, the logsumexp squares, the rows),
  // over the cp ranks when a sequence is split over them.
  std::vector<double> sums(2 * selections_.size() + 2);
  for (std::size_t i = 0; i < selections_.size(); ++i)
    sums[i] = static_cast<double>(selections_[i]), sums[selections_.size() + i] = probability_sums_[i];
  sums[2 * selections_.size()] = lse_squared_sum_;
  sums[2 * selections_.size() + 1] = static_cast<double>(rows_);
  if (cp) cp->sum_over_ranks(sums);
  const double* selected = sums.data();
  const double* probabilities = sums.data() + selections_.size();
  const double R = sums.back(), lse_squared = sums[2 * selections_.size()];
  // This rank's rows' share of the gradient: fully_shard averages over the cp ranks, which hold R / cp rows each.
  const double R_local = static_cast<double>(rows_);
  std::vector<double> f(sz(E), 0.0), P(sz(E), 0.0);
  for (int l = 0; l < layers_; ++l)
    for (int e = 0; e < E; ++e) {
      f[sz(e)] += selected[sz(std::int64_t{l} * E + e)] / R;
      P[sz(e)] += probabilities[sz(std::int64_t{l} * E + e)] / R;
    }
  aux_loss_ = 0;
  for (int e = 0; e < E; ++e) aux_loss_ += f[sz(e)] * P[sz(e)];
  aux_loss_ *= E;
  z_loss_ = lse_squared / R;
  z_scale_ = static_cast<float>(config_.router_z_loss_coef * loss_scale / R_local);
  if (config_.balance == MoeBalance::aux_loss) {
    if (aux_grad_.extent(0) == 0) aux_grad_ = View1<float>("router.aux_grad", sz(E));
    auto host = Kokkos::create_mirror_view(aux_grad_);
    for (int e = 0; e < E; ++e)
      host(sz(e)) = static_cast<float>(config_.aux_loss_coef * loss_scale * E * f[sz(e)] / R_local);
    Kokkos::deep_copy(aux_grad_, host);
  }
}

void RouterStatistics::state(std::vector<double>& out) const {
  const std::size_t n = selections_.size();
  out.resize(state_size());
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<double>(selections_[i]), out[n + i] = probability_sums_[i];
  out[2 * n] = lse_squared_sum_;
  out[2 * n + 1] = static_cast<double>(rows_);
  out[2 * n + 2] = static_cast<double>(dropped_);
  out[2 * n + 3] = recorded_ ? 1.0 : 0.0;
}

void RouterStatistics::restore(const std::vector<double>& state) {
  const std::size_t n = selections_.size();
  FSDPP_CHECK(state.size() == state_size(), "router statistics of {} values where {} were expected", state.size(),
              state_size());
  for (std::size_t i = 0; i < n; ++i)
    selections_[i] = static_cast<std::int64_t>(state[i]), probability_sums_[i] = state[n + i];
  lse_squared_sum_ = state[2 * n];
  rows_ = static_cast<std::int64_t>(state[2 * n + 1]);
  dropped_ = static_cast<std::int64_t>(state[2 * n + 2]);
  recorded_ = state[2 * n + 3] != 0.0;
}

double RouterStatistics::weighted_loss() const {
  return (config_.balance == MoeBalance::aux_loss ? config_.aux_loss_coef * aux_loss_ : 0.0) +
         config_.router_z_loss_coef * z_loss_;
}

std::vector<double> expert_load_per_layer(const std::vector<double>& selections, int layers) {
  const std::size_t E = layers > 0 ? selections.size() / sz(layers) : 0;
  std::vector<double> out;
  for (std::size_t l = 0; l < sz(layers); ++l) {
    double max = 0, sum = 0;
    for (std::size_t e = 0; e < E; ++e) max = std::max(max, selections[l * E + e]), sum += selections[l * E + e];
    out.push_back(sum > 0 ? max * static_cast<double>(E) / sum : 0.0);
  }
  return out;
}


std::int64_t expert_capacity_rows(double capacity_factor, std::int64_t pairs, int experts) {
  return capacity_factor > 0 ? static_cast<std::int64_t>(std::ceil(capacity_factor * static_cast<double>(pairs) / experts))
                             : 0;
}

// ---------------------------------------------------------------------------------------------------------
// RoutedExperts and MoeFeedForward: parameters and buffers

RoutedExperts::RoutedExperts(const ModelConfig& c, const MoeNames& n, float std, float down_std)
    : Module("RoutedExperts"),
      gate(add_parameter(n.gate + ".weight", {c.moe.num_experts, c.moe.expert_ffn_hidden, c.n_embd},
                         InitRule::normal(std), ParamRole::weight)),
      up(add_parameter(n.up + ".weight", {c.moe.num_experts, c.moe.expert_ffn_hidden, c.n_embd}, InitRule::normal(std),
                       ParamRole::weight)),
      down(add_parameter(n.down + ".weight", {c.moe.num_experts, c.n_embd, c.moe.expert_ffn_hidden},
                         InitRule::normal(down_std), ParamRole::weight)),
      C_(c.n_embd),
      F_(c.moe.expert_ffn_hidden) {}

MoeFeedForward::MoeFeedForward(Module& owner, const ModelConfig& c, const MoeNames& n, float std, float down_std)
    : router(owner.add_parameter(n.prefix + n.router + ".weight", {c.moe.num_experts, c.n_embd}, InitRule::normal(std),
                                 ParamRole::weight)),
      experts(c, n, std, down_std),
      C_(c.n_embd),
      E_(c.moe.num_experts),
      k_(c.moe.top_k),
      F_(c.moe.expert_ffn_hidden),
      normalize_(c.moe.norm_topk_prob),
      capacity_factor_(c.moe.capacity_factor),
      balance_(c.moe.balance),
      counts_(sz(E_)),
      offsets_(sz(E_) + 1) {
  if (balance_ == MoeBalance::bias) {
    routing_bias = &owner.add_parameter(n.prefix + n.router + ".e_score_correction_bias", {c.moe.num_experts},
                                        InitRule::zeros(), ParamRole::bias);
    routing_bias->set_trainable(false);
  }
}

MoeFeedForward::~MoeFeedForward() = default;

// Each rank moves the experts whose bias rows it holds (its shard, or the whole vector when unsharded): the step's
// loads are the same everywhere, so the shards stay one vector. Integers summed in doubles: exact, so reproducible.
void MoeFeedForward::balance_load(const double* tokens, double rate) {
  if (!routing_bias) return;
  double mean = 0;
  for (int e = 0; e < E_; ++e) mean += tokens[e];
  mean /= E_;
  auto host = Kokkos::create_mirror_view_and_copy(HostSpace(), routing_bias->value());
  for (const GlobalPiece& piece : routing_bias->global_pieces())
    for (std::int64_t r = 0; r < piece.rows; ++r) {
      const double load = tokens[piece.global_row + r];
      const float step = static_cast<float>(rate) * static_cast<float>((mean > load) - (mean < load));
      host(sz(piece.local_row + r)) += step;
    }
  Kokkos::deep_copy(routing_bias->value(), host);
}

void MoeFeedForward::use_expert_parallel(ExpertParallelGroup& group, const std::string& label, bool per_source) {
  per_source_ = per_source;
  const int L = group.experts_per_rank(E_);
  FSDPP_REQUIRE(group.width() == C_, "{}: the expert-parallel group moves rows of {} floats, but this layer's are {}",
                label, group.width(), C_);
  for (Parameter* p : {&experts.gate, &experts.up, &experts.down})
    p->set_tensor_parallel(TensorParallelPlacement{0, group.ranks(), group.rank(), 1, group.mesh_dim(), true});
  FSDPP_CHECK(experts.local_experts() == L, "{}: {} local experts after the split, expected {}", label,
              experts.local_experts(), L);
  ep_ = &group;
  ep_label_ = label;
  routing_ = std::make_unique<ExpertRouting>(group.make_routing(label));
}

MoeFeedForward::ForwardState::ForwardState() = default;
MoeFeedForward::ForwardState::~ForwardState() = default;
MoeFeedForward::ForwardState::ForwardState(ForwardState&&) noexcept = default;
MoeFeedForward::ForwardState& MoeFeedForward::ForwardState::operator=(ForwardState&&) noexcept = default;

void MoeFeedForward::swap_forward_state(ForwardState& other) {
  std::swap(routed_, other.routed);
  std::swap(blocks_, other.blocks);
  std::swap(by_source_, other.by_source);
  std::swap(routing_, other.routing);  // a slot's first forward makes its own (forward)
}

std::int64_t MoeFeedForward::expert_rows_capacity(int N) const {
  return ep_ ? ep_->capacity_rows() : std::int64_t{N} * k_;
}

void MoeActivations::ensure(const std::string& label, const MoeFeedForward& moe, int N) {
  buffers.ensure(label + ".moe", N, 1, [&] { return moe.activation_table(*this, N); });
}

// Forward's buffers for N rows; R = N k routed rows at most (dropless), so the worst case is the size. The experts'
// rows: R, or under ep the most this rank may receive (Re), in received_x / received_out.
BufferTable MoeFeedForward::activation_table(MoeActivations& a, int N) const {
  const std::int64_t R = std::int64_t{N} * k_, Re = expert_rows_capacity(N);
  BufferTable t;
  t.add("router_logits", sz(std::int64_t{N} * E_), a.logits);
  t.add("router_probs", sz(std::int64_t{N} * E_), a.probs);
  t.add("router_lse", sz(N), a.lse);
  t.add("router_weights", sz(R), a.weights);    // (N, k) combine weights
  t.add("router_selected", sz(R), a.selected);  // (N, k) expert ids
  t.add("slot_token", sz(R), a.slot_token);
  t.add("slot_pair", sz(R), a.slot_pair);
  t.add("token_slot", sz(R), a.token_slot);
  t.add("routed_x", sz(R * C_), a.xs);          // the routed rows in expert order
  t.add("routed_out", sz(R * C_), a.ys);        // the experts' outputs, back in that order, before the combine
  if (ep_) {
    t.add("received_x", sz(Re * C_), a.xr);     // the rows this rank's experts received
    t.add("received_out", sz(Re * C_), a.yr);   // their outputs, before they go home
  }
  t.add("expert_gate", sz(Re * F_), a.gate);
  t.add("expert_up", sz(Re * F_), a.up);
  t.add("expert_h", sz(Re * F_), a.h);          // silu(gate) * up: the down projections' input
  return t;
}

BufferTable MoeFeedForward::scratch_table(MoeScratch& s, int N) const {
  const std::int64_t R = std::int64_t{N} * k_, Re = expert_rows_capacity(N);
  BufferTable t;
  t.add("drouted_out", sz(R * C_), s.dys);
  t.add("drouter_weights", sz(R), s.dweights);
  if (ep_) {
    t.add("dreceived_out", sz(Re * C_), s.dyr);
    t.add("dreceived_x", sz(Re * C_), s.dxr);
  }
  t.add("dexpert_h", sz(Re * F_), s.dh);
  t.add("dexpert_gate", sz(Re * F_), s.dgate);
  t.add("dexpert_up", sz(Re * F_), s.dup);
  t.add("drouted_x", sz(R * C_), s.dxs);
  t.add("drouter_logits", sz(std::int64_t{N} * E_), s.dlogits);
  t.add("router_probability_sums", sz(E_), s.probability_sums);
  return t;
}

template <class F> void RoutedExperts::for_each_block(const F& f) const {
  for (const RowBlock& b : *batch_.blocks)
    if (b.rows > 0) f(b.expert, b.first, b.rows);
}

// The blocks' rows as maximal contiguous spans: one span [0, R) when they tile it (forward, and every backward but
// reproducible mode's per source rank).
template <class F> void RoutedExperts::for_each_span(const F& f) const {
  std::int64_t first = 0, n = 0;
  for (const RowBlock& b : *batch_.blocks) {
    if (b.rows == 0) continue;
    if (n > 0 && b.first != first + n) f(first, n), n = 0;
    if (n == 0) first = b.first;
    n += b.rows;
  }
  if (n > 0) f(first, n);
}

std::int64_t RoutedExperts::end_row() const {
  std::int64_t end = 0;
  for (const RowBlock& b : *batch_.blocks) end = std::max(end, b.first + b.rows);
  return end;
}

// The counting sort: the pairs (t, j) by expert, token order inside each (the fixed order every later sum
// follows); a capacity keeps each expert's first rows. Host tables grow once to the worst case.
void MoeFeedForward::route(MoeActivations& a, int N) {
  const std::int64_t pairs = std::int64_t{N} * k_;
  if (static_cast<std::int64_t>(host_selected_.extent(0)) < pairs) {
    host_selected_ = HostView1<std::int32_t>("moe.selected_host", sz(pairs));
    host_slot_token_ = HostView1<std::int32_t>("moe.slot_token_host", sz(pairs));
    host_slot_pair_ = HostView1<std::int32_t>("moe.slot_pair_host", sz(pairs));
    host_token_slot_ = HostView1<std::int32_t>("moe.token_slot_host", sz(pairs));
  }
  Kokkos::deep_copy(Kokkos::subview(host_selected_, std::make_pair(std::int64_t{0}, pairs)),
                    Kokkos::subview(a.selected, std::make_pair(std::int64_t{0}, pairs)));
  std::vector<std::int64_t> wanted(sz(E_), 0);
  for (std::int64_t p = 0; p < pairs; ++p) ++wanted[sz(host_selected_(sz(p)))];
  const std::int64_t kept = expert_capacity_rows(capacity_factor_, pairs, E_);
  const std::int64_t capacity = kept > 0 ? kept : pairs;
  offsets_[0] = 0;
  for (int e = 0; e < E_; ++e) {
    counts_[sz(e)] = std::min(wanted[sz(e)], capacity);
    offsets_[sz(e) + 1] = offsets_[sz(e)] + counts_[sz(e)];
  }
  routed_ = offsets_[sz(E_)];
  dropped_ = pairs - routed_;
  std::vector<std::int64_t> next(offsets_.begin(), offsets_.end() - 1);
  for (std::int64_t p = 0; p < pairs; ++p) {
    const int e = host_selected_(sz(p));
    const bool kept = next[sz(e)] < offsets_[sz(e) + 1];
    host_token_slot_(sz(p)) = kept ? static_cast<std::int32_t>(next[sz(e)]) : -1;
    if (!kept) continue;
    host_slot_token_(sz(next[sz(e)])) = static_cast<std::int32_t>(p / k_);
    host_slot_pair_(sz(next[sz(e)])) = static_cast<std::int32_t>(p);
    ++next[sz(e)];
  }
  const auto first = [](std::int64_t n) { return std::make_pair(std::int64_t{0}, n); };
  Kokkos::deep_copy(Kokkos::subview(a.token_slot, first(pairs)), Kokkos::subview(host_token_slot_, first(pairs)));
  Kokkos::deep_copy(Kokkos::subview(a.slot_token, first(routed_)), Kokkos::subview(host_slot_token_, first(routed_)));
  Kokkos::deep_copy(Kokkos::subview(a.slot_pair, first(routed_)), Kokkos::subview(host_slot_pair_, first(routed_)));
}

namespace {
// Rows [first, first + n) of a (rows, width) buffer.
View1<float> rows_of(const View1<float>& v, std::int64_t first, std::int64_t n, int width) {
  return Kokkos::subview(v, std::make_pair(first * width, (first + n) * width));
}
// Expert e's (rows, cols) matrix of a stacked (E, rows, cols) parameter.
View1<float> expert_of(const View1<float>& stacked, int e, std::int64_t rows, std::int64_t cols) {
  return Kokkos::subview(stacked, std::make_pair(e * rows * cols, (e + 1) * rows * cols));
}
}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Forward and backward, side by side

// The experts: for each block of rows [first, first + n) of local expert j: g = x Wg^T, u = x Wu^T;
// h = silu(g) * u; y = h Wd^T. Grouped GEMMs on subviews, no copies. A pass covers its blocks' rows only (the
// elementwise kernels run once over [0, R) when the blocks tile it, as they do but in a per-source backward).
void RoutedExperts::forward(Flow& flow) {
  const int C = C_, F = F_;
  const View1<float> x = flow.x;
  for_each_block([&](int j, std::int64_t first, std::int64_t n) {
    const int rows = static_cast<int>(n);
    linear_forward<float>(rows_of(batch_.gate, first, n, F), rows_of(x, first, n, C), expert_of(gate.value(), j, F, C),
                          View1<float>(), rows, C, F);
    linear_forward<float>(rows_of(batch_.up, first, n, F), rows_of(x, first, n, C), expert_of(up.value(), j, F, C),
                          View1<float>(), rows, C, F);
  });
  for_each_span([&](std::int64_t first, std::int64_t n) {
    swiglu_forward<float>(rows_of(batch_.h, first, n, F), rows_of(batch_.gate, first, n, F),
                          rows_of(batch_.up, first, n, F), n * F);
  });
  for_each_block([&](int j, std::int64_t first, std::int64_t n) {
    linear_forward<float>(rows_of(batch_.y, first, n, C), rows_of(batch_.h, first, n, F), expert_of(down.value(), j, C, F),
                          View1<float>(), static_cast<int>(n), F, C);
  });
  flow.x = rows_of(batch_.y, 0, end_row(), C);
}

void RoutedExperts::backward(Flow& flow) {
  const int C = C_, F = F_;
  const View1<float> dy = flow.dx;
  // y = h Wd^T per block
  for_each_span([&](std::int64_t first, std::int64_t n) { Kokkos::deep_copy(rows_of(batch_.dh, first, n, F), 0.0f); });
  for_each_block([&](int j, std::int64_t first, std::int64_t n) {
    const int rows = static_cast<int>(n);
    const View1<float> dys = rows_of(dy, first, n, C);
    linear_backward_input<float>(rows_of(batch_.dh, first, n, F), dys, expert_of(down.value(), j, C, F), rows, F, C);
    linear_backward_weight<float>(expert_of(down.grad(), j, C, F), View1<float>(), dys, rows_of(batch_.h, first, n, F),
                                  rows, F, C);
  });
  // h = silu(g) * u
  for_each_span([&](std::int64_t first, std::int64_t n) {
    const View1<float> dg = rows_of(batch_.dgate, first, n, F), du = rows_of(batch_.dup, first, n, F);
    Kokkos::deep_copy(dg, 0.0f);
    Kokkos::deep_copy(du, 0.0f);
    swiglu_backward<float>(dg, du, rows_of(batch_.dh, first, n, F), rows_of(batch_.gate, first, n, F),
                           rows_of(batch_.up, first, n, F), n * F);
    Kokkos::deep_copy(rows_of(batch_.dx, first, n, C), 0.0f);
  });
  // g = x Wg^T, u = x Wu^T per block
  for_each_block([&](int j, std::int64_t first, std::int64_t n) {
    const int rows = static_cast<int>(n);
    const View1<float> dx = rows_of(batch_.dx, first, n, C), x = rows_of(batch_.x, first, n, C);
    const View1<float> dg = rows_of(batch_.dgate, first, n, F), du = rows_of(batch_.dup, first, n, F);
    linear_backward_input<float>(dx, dg, expert_of(gate.value(), j, F, C), rows, C, F);
    linear_backward_input<float>(dx, du, expert_of(up.value(), j, F, C), rows, C, F);
    linear_backward_weight<float>(expert_of(gate.grad(), j, F, C), View1<float>(), dg, x, rows, C, F);
    linear_backward_weight<float>(expert_of(up.grad(), j, F, C), View1<float>(), du, x, rows, C, F);
  });
  flow.dx = rows_of(batch_.dx, 0, end_row(), C);
}

// The experts' row blocks of the last routing: per expert (its rows from every source together), or per expert and
// source rank (per_source_), in the received order (expert, then source).
void MoeFeedForward::make_blocks() {
  blocks_.clear();
  if (!ep_) {
    for (int e = 0; e < E_; ++e) blocks_.push_back({e, offsets_[sz(e)], counts_[sz(e)]});
    return;
  }
  const ExpertRouting& r = *routing_;
  const int L = static_cast<int>(r.expert_rows.size()), Q = ep_->ranks();
  by_source_.assign(per_source_ ? sz(Q) : 0, {});
  std::int64_t first = 0;
  for (int j = 0; j < L; ++j) {
    if (!per_source_) {
      blocks_.push_back({j, first, r.expert_rows[sz(j)]});
      first += r.expert_rows[sz(j)];
      continue;
    }
    for (int q = 0; q < Q; ++q) {
      const std::int64_t n = r.rows_from[sz(q) * sz(L) + sz(j)];
      blocks_.push_back({j, first, n});
      by_source_[sz(q)].push_back({j, first, n});
      first += n;
    }
  }
}

RoutedExperts::Batch MoeFeedForward::batch(MoeActivations& a, MoeScratch& s) const {
  RoutedExperts::Batch b;
  b.blocks = &blocks_;
  b.x = ep_ ? a.xr : a.xs;
  b.y = ep_ ? a.yr : a.ys;
  b.gate = a.gate, b.up = a.up, b.h = a.h;
  b.dgate = s.dgate, b.dup = s.dup, b.dh = s.dh;
  b.dx = ep_ ? s.dxr : s.dxs;
  return b;
}

// Routed rows (by global expert) -> their experts -> back in the same order. Under expert parallelism the rows
// travel to the experts' ranks and back (dispatch, combine); the experts compute on what their rank received.
void MoeFeedForward::forward(const View1<float>& out, const View1<float>& x, int N, MoeActivations& a, MoeScratch& s,
                             RouterStatistics* stats, int layer) {
  const int C = C_, E = E_;
  if (ep_ && !routing_) routing_ = std::make_unique<ExpertRouting>(ep_->make_routing(ep_label_));  // a new slot's
  linear_forward<float>(a.logits, x, router.value(), View1<float>(), N, C, E);
  const View1<float> bias = routing_bias ? routing_bias->value() : View1<float>();
  router_topk<float>(a.probs, a.lse, a.selected, a.weights, a.logits, bias, N, E, k_, normalize_);
  route(a, N);
  gather_routed_rows<float>(a.xs, x, a.slot_token, routed_, C);
  Flow rows;
  rows.x = rows_of(a.xs, 0, routed_, C);
  if (ep_) {
    if (counts_device_.extent(0) == 0) {  // at the first forward (a planned model never runs one)
      counts_device_ = View1<std::int64_t>("moe.counts " + routing_->label, sz(E));
      counts_host_ = Kokkos::create_mirror_view(counts_device_);
    }
    for (int e = 0; e < E; ++e) counts_host_(sz(e)) = counts_[sz(e)];
    Kokkos::deep_copy(counts_device_, counts_host_);
    rows.x = ep_->dispatch(*routing_, rows.x, counts_device_, a.xr);
  }
  make_blocks();
  experts.bind(batch(a, s));
  experts(rows);
  if (ep_) ep_->combine(*routing_, rows.x, a.ys);
  sum_routed_rows<float>(out, a.ys, a.token_slot, a.weights, N, C, k_, /*accumulate=*/false);
  if (!stats) return;
  // Selections count every pair the router chose (dropped ones too), as transformers' loss does.
  std::vector<std::int64_t> selections(sz(E), 0);
  for (std::int64_t p = 0; p < std::int64_t{N} * k_; ++p) ++selections[sz(host_selected_(sz(p)))];
  router_probability_sums<float>(s.probability_sums, a.probs, N, E);
  auto sums = Kokkos::create_mirror_view_and_copy(HostSpace(), s.probability_sums);
  auto lse = Kokkos::create_mirror_view_and_copy(HostSpace(), Kokkos::subview(a.lse, std::make_pair(0, N)));
  std::vector<double> probability_sums(sz(E));
  for (int e = 0; e < E; ++e) probability_sums[sz(e)] = sums(sz(e));
  double lse_squared = 0;
  for (int t = 0; t < N; ++t) lse_squared += double{lse(sz(t))} * lse(sz(t));
  stats->record(layer, selections, probability_sums, lse_squared, N, dropped_);
}

void MoeFeedForward::backward(const View1<float>& dx, const View1<float>& dout, const View1<float>& x, int N,
                              MoeActivations& a, MoeScratch& s, const RouterStatistics* stats, float loss_scale) {
  (void)loss_scale;  // the balancing losses' scales are in `stats` (RouterStatistics::finish)
  const int C = C_, E = E_;
  // out = combine(ys, w): d(ys) per slot, d(w) per pair
  combine_routed_rows_backward<float>(s.dys, s.dweights, dout, a.ys, a.slot_pair, a.token_slot, a.weights, routed_, N,
                                      C, k_);
  // The experts, on their rows: under ep the gradients travel as the rows did (combine's backward), and back.
  Flow rows;
  rows.dx = rows_of(s.dys, 0, routed_, C);
  if (ep_) rows.dx = ep_->combine_backward(*routing_, rows.dx, s.dyr);
  RoutedExperts::Batch b = batch(a, s);
  if (per_source_) {  // one backward per source rank, each reduced on its own (use_expert_parallel)
    const View1<float> dy = rows.dx;
    for (const auto& blocks : by_source_) {
      b.blocks = &blocks;
      experts.bind(b);
      rows.dx = dy;
      experts(rows, Pass::backward);
    }
    rows.dx = rows_of(s.dxr, 0, routing_->received_rows, C);
  } else {
    experts.bind(b);
    experts(rows, Pass::backward);
  }
  if (ep_) ep_->dispatch_backward(*routing_, rows.dx, s.dxs);
  // xs = x[slot_token]
  sum_routed_rows<float>(dx, s.dxs, a.token_slot, View1<float>(), N, C, k_, /*accumulate=*/true);
  // The router: top-k weights, the balancing losses, the softmax; logits = x Wr^T
  const View1<float> aux_grad = stats ? stats->aux_grad() : View1<float>();
  router_backward<float>(s.dlogits, a.probs, a.lse, a.selected, a.weights, s.dweights, aux_grad,
                         stats ? stats->z_scale() : 0.0f, N, E, k_, normalize_);
  linear_backward_input<float>(dx, s.dlogits, router.value(), N, C, E);
  linear_backward_weight<float>(router.grad(), View1<float>(), s.dlogits, x, N, C, E);
}

}  // namespace fsdpp
