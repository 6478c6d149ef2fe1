#include "fsdpp/nn/moe.hpp"

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
void RouterStatistics::finish(float loss_scale) {
  if (!recorded_) return;
  const int E = config_.num_experts;
  const double R = static_cast<double>(rows_);
  std::vector<double> f(sz(E), 0.0), P(sz(E), 0.0);
  for (int l = 0; l < layers_; ++l)
    for (int e = 0; e < E; ++e) {
      f[sz(e)] += static_cast<double>(selections_[sz(std::int64_t{l} * E + e)]) / R;
      P[sz(e)] += probability_sums_[sz(std::int64_t{l} * E + e)] / R;
    }
  aux_loss_ = 0;
  for (int e = 0; e < E; ++e) aux_loss_ += f[sz(e)] * P[sz(e)];
  aux_loss_ *= E;
  z_loss_ = lse_squared_sum_ / R;
  z_scale_ = static_cast<float>(config_.router_z_loss_coef * loss_scale / R);
  if (config_.balance == MoeBalance::aux_loss) {
    if (aux_grad_.extent(0) == 0) aux_grad_ = View1<float>("router.aux_grad", sz(E));
    auto host = Kokkos::create_mirror_view(aux_grad_);
    for (int e = 0; e < E; ++e) host(sz(e)) = static_cast<float>(config_.aux_loss_coef * loss_scale * E * f[sz(e)] / R);
    Kokkos::deep_copy(aux_grad_, host);
  }
}

double RouterStatistics::weighted_loss() const {
  return (config_.balance == MoeBalance::aux_loss ? config_.aux_loss_coef * aux_loss_ : 0.0) +
         config_.router_z_loss_coef * z_loss_;
}

std::vector<double> RouterStatistics::load_imbalance() const {
  const int E = config_.num_experts;
  std::vector<double> out;
  for (int l = 0; l < layers_; ++l) {
    std::int64_t max = 0, sum = 0;
    for (int e = 0; e < E; ++e) {
      const std::int64_t n = selections_[sz(std::int64_t{l} * E + e)];
      max = std::max(max, n), sum += n;
    }
    out.push_back(sum > 0 ? static_cast<double>(max) * E / static_cast<double>(sum) : 0.0);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// MoeFeedForward: parameters and buffers

MoeFeedForward::MoeFeedForward(Module& owner, const ModelConfig& c, const MoeNames& n, float std, float down_std)
    : router(owner.add_parameter(n.prefix + n.router + ".weight", {c.moe.num_experts, c.n_embd}, InitRule::normal(std),
                                 ParamRole::weight)),
      gate(owner.add_parameter(n.prefix + "experts." + n.gate + ".weight",
                               {c.moe.num_experts, c.moe.expert_ffn_hidden, c.n_embd}, InitRule::normal(std),
                               ParamRole::weight)),
      up(owner.add_parameter(n.prefix + "experts." + n.up + ".weight",
                             {c.moe.num_experts, c.moe.expert_ffn_hidden, c.n_embd}, InitRule::normal(std),
                             ParamRole::weight)),
      down(owner.add_parameter(n.prefix + "experts." + n.down + ".weight",
                               {c.moe.num_experts, c.n_embd, c.moe.expert_ffn_hidden}, InitRule::normal(down_std),
                               ParamRole::weight)),
      C_(c.n_embd),
      E_(c.moe.num_experts),
      k_(c.moe.top_k),
      F_(c.moe.expert_ffn_hidden),
      normalize_(c.moe.norm_topk_prob),
      capacity_factor_(c.moe.capacity_factor),
      balance_(c.moe.balance),
      counts_(sz(E_)),
      offsets_(sz(E_) + 1) {}

void MoeActivations::ensure(const std::string& label, const MoeFeedForward& moe, int N) {
  buffers.ensure(label + ".moe", N, 1, [&] { return moe.activation_table(*this, N); });
}

// Forward's buffers for N rows; R = N k routed rows at most (dropless), so the worst case is the size.
BufferTable MoeFeedForward::activation_table(MoeActivations& a, int N) const {
  const std::int64_t R = std::int64_t{N} * k_;
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
  t.add("expert_gate", sz(R * F_), a.gate);
  t.add("expert_up", sz(R * F_), a.up);
  t.add("expert_h", sz(R * F_), a.h);           // silu(gate) * up: the down projections' input
  t.add("expert_out", sz(R * C_), a.ys);        // the experts' outputs, before the combine
  return t;
}

BufferTable MoeFeedForward::scratch_table(MoeScratch& s, int N) const {
  const std::int64_t R = std::int64_t{N} * k_;
  BufferTable t;
  t.add("dexpert_out", sz(R * C_), s.dys);
  t.add("drouter_weights", sz(R), s.dweights);
  t.add("dexpert_h", sz(R * F_), s.dh);
  t.add("dexpert_gate", sz(R * F_), s.dgate);
  t.add("dexpert_up", sz(R * F_), s.dup);
  t.add("drouted_x", sz(R * C_), s.dxs);
  t.add("drouter_logits", sz(std::int64_t{N} * E_), s.dlogits);
  t.add("router_probability_sums", sz(E_), s.probability_sums);
  return t;
}

template <class F> void MoeFeedForward::for_each_expert(const F& f) const {
  for (int e = 0; e < E_; ++e)
    if (counts_[sz(e)] > 0) f(e, offsets_[sz(e)], counts_[sz(e)]);
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
  const std::int64_t capacity =
      capacity_factor_ > 0 ? static_cast<std::int64_t>(std::ceil(capacity_factor_ * static_cast<double>(pairs) / E_))
                           : pairs;
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

void MoeFeedForward::forward(const View1<float>& out, const View1<float>& x, int N, MoeActivations& a, MoeScratch& s,
                             RouterStatistics* stats, int layer) {
  const int C = C_, E = E_, F = F_;
  linear_forward<float>(a.logits, x, router.value(), View1<float>(), N, C, E);
  router_topk<float>(a.probs, a.lse, a.selected, a.weights, a.logits, bias_, N, E, k_, normalize_);
  route(a, N);
  gather_routed_rows<float>(a.xs, x, a.slot_token, routed_, C);
  for_each_expert([&](int e, std::int64_t first, std::int64_t n) {
    const int rows = static_cast<int>(n);
    linear_forward<float>(rows_of(a.gate, first, n, F), rows_of(a.xs, first, n, C), expert_of(gate.value(), e, F, C),
                          View1<float>(), rows, C, F);
    linear_forward<float>(rows_of(a.up, first, n, F), rows_of(a.xs, first, n, C), expert_of(up.value(), e, F, C),
                          View1<float>(), rows, C, F);
  });
  swiglu_forward<float>(a.h, a.gate, a.up, routed_ * F);
  for_each_expert([&](int e, std::int64_t first, std::int64_t n) {
    linear_forward<float>(rows_of(a.ys, first, n, C), rows_of(a.h, first, n, F), expert_of(down.value(), e, C, F),
                          View1<float>(), static_cast<int>(n), F, C);
  });
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
  const int C = C_, E = E_, F = F_;
  // out = combine(ys, w): d(ys) per slot, d(w) per pair
  combine_routed_rows_backward<float>(s.dys, s.dweights, dout, a.ys, a.slot_pair, a.token_slot, a.weights, routed_, N,
                                      C, k_);
  // ys = h Wd^T per expert
  Kokkos::deep_copy(s.dh, 0.0f);
  for_each_expert([&](int e, std::int64_t first, std::int64_t n) {
    const int rows = static_cast<int>(n);
    const View1<float> dys = rows_of(s.dys, first, n, C);
    linear_backward_input<float>(rows_of(s.dh, first, n, F), dys, expert_of(down.value(), e, C, F), rows, F, C);
    linear_backward_weight<float>(expert_of(down.grad(), e, C, F), View1<float>(), dys, rows_of(a.h, first, n, F),
                                  rows, F, C);
  });
  // h = silu(g) * u
  Kokkos::deep_copy(s.dgate, 0.0f);
  Kokkos::deep_copy(s.dup, 0.0f);
  swiglu_backward<float>(s.dgate, s.dup, s.dh, a.gate, a.up, routed_ * F);
  // g = xs Wg^T, u = xs Wu^T per expert
  Kokkos::deep_copy(s.dxs, 0.0f);
  for_each_expert([&](int e, std::int64_t first, std::int64_t n) {
    const int rows = static_cast<int>(n);
    const View1<float> dxs = rows_of(s.dxs, first, n, C), xs = rows_of(a.xs, first, n, C);
    const View1<float> dg = rows_of(s.dgate, first, n, F), du = rows_of(s.dup, first, n, F);
    linear_backward_input<float>(dxs, dg, expert_of(gate.value(), e, F, C), rows, C, F);
    linear_backward_input<float>(dxs, du, expert_of(up.value(), e, F, C), rows, C, F);
    linear_backward_weight<float>(expert_of(gate.grad(), e, F, C), View1<float>(), dg, xs, rows, C, F);
    linear_backward_weight<float>(expert_of(up.grad(), e, F, C), View1<float>(), du, xs, rows, C, F);
  });
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
