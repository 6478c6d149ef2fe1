#include "fsdpp/nn/llama.hpp"

#include "fsdpp/nn/attention_dispatch.hpp"
#include "fsdpp/nn/kernels/crossentropy.hpp"
#include "fsdpp/nn/kernels/embedding.hpp"
#include "fsdpp/nn/kernels/linear.hpp"
#include "fsdpp/nn/kernels/residual.hpp"
#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/nn/kernels/rope.hpp"
#include "fsdpp/nn/kernels/vocab_parallel.hpp"
#include "fsdpp/nn/kernels/swiglu.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/matmul.hpp"

#include <fmt/format.h>

#include <cmath>

namespace fsdpp {

using namespace kernels;

namespace {
std::int64_t bytes_of(std::initializer_list<const View1<float>*> views) {
  std::int64_t total = 0;
  for (const auto* v : views) total += static_cast<std::int64_t>(v->extent(0)) * 4;
  return total;
}
const float kStd = 0.02f;
}  // namespace

struct LlamaScratch {
  int B = 0, T = 0;
  View1<float> dres2;  // (B,T,C) gradient of the residual after attention
  View1<float> dln;    // (B,T,C) gradient of an RMSNorm output
  View1<float> dqkv;   // (B,T,C+2KC)
  View1<float> datty;  // (B,T,C)
  View1<float> datt;   // (B,NH,T,T); fused: (B,NH,T), the row term D
  View1<float> dh;     // (B,T,F)
  View1<float> dgate;  // (B,T,F)
  View1<float> dup;    // (B,T,F)
  View1<float> attention_workspace;  // model.attention batched: attention_workspace_floats, else empty
  // Sequence parallelism only (empty otherwise), as GPT's BlockScratch: dres2 then holds the gathered gradient.
  View1<float> gathered;   // (B,T,C): a gathered gradient, or a row-parallel layer's partial sums
  View1<float> dln_local;  // (Nl,C)
  View1<float> norm_grads; // (2C): the two RMSNorm gradients of one backward, before their all-reduce

  // Tensor parallelism: this rank's heads and features (local_* of the config); every width below is W, C, F
  // without it.
  void ensure(const LlamaConfig& c, int B_, int T_) {
    if (B == B_ && T == T_) return;
    B = B_, T = T_;
    const std::size_t N = static_cast<std::size_t>(B) * T, C = c.n_embd, F = c.local_ffn(), Cl = c.local_width();
    const std::size_t W = Cl + 2 * static_cast<std::size_t>(c.local_kv_width());
    dres2 = uninitialized<float>("llama_block.dres2", N * C);
    dln = uninitialized<float>("llama_block.dln", N * C);
    dqkv = uninitialized<float>("llama_block.dqkv", N * W);
    datty = uninitialized<float>("llama_block.datty", N * Cl);
    datt = uninitialized<float>("llama_block.datt",
                                static_cast<std::size_t>(B) * c.local_heads() * T * attention_row_floats(c.attention, T));
    dh = uninitialized<float>("llama_block.dh", N * F);
    dgate = uninitialized<float>("llama_block.dgate", N * F);
    dup = uninitialized<float>("llama_block.dup", N * F);
    attention_workspace = uninitialized<float>(
        "llama_block.attention_workspace",
        static_cast<std::size_t>(attention_workspace_floats(c.attention, B, T, static_cast<int>(W), static_cast<int>(Cl))));
    if (c.sequence_parallel) {
      gathered = uninitialized<float>("llama_block.gathered", N * C);
      dln_local = uninitialized<float>("llama_block.dln_local", static_cast<std::size_t>(c.local_rows(N)) * C);
      norm_grads = uninitialized<float>("llama_block.norm_grads", 2 * C);
    }
  }
  std::int64_t bytes() const {
    return bytes_of({&dres2, &dln, &dqkv, &datty, &datt, &dh, &dgate, &dup, &attention_workspace, &gathered,
                     &dln_local, &norm_grads});
  }
};

// cos and sin (context_length, hs/2), filled once on the first forward (after to_empty: nothing on meta).
struct RopeTables {
  View1<float> cos, sin;
  void ensure(const LlamaConfig& c) {
    if (cos.extent(0) != 0) return;
    std::vector<double> ch, sh;
    rope_table(ch, sh, c.context_length, c.head_size(), c.rope_theta, c.rope_scaling);
    cos = uninitialized<float>("llama.rope_cos", ch.size());
    sin = uninitialized<float>("llama.rope_sin", sh.size());
    auto cm = Kokkos::create_mirror_view(cos);
    auto sm = Kokkos::create_mirror_view(sin);
    for (std::size_t i = 0; i < ch.size(); ++i) cm(i) = static_cast<float>(ch[i]), sm(i) = static_cast<float>(sh[i]);
    Kokkos::deep_copy(cos, cm);
    Kokkos::deep_copy(sin, sm);
  }
  std::int64_t bytes() const { return bytes_of({&cos, &sin}); }
};

// ---------------------------------------------------------------------------------------------------------
// Config

std::int64_t LlamaConfig::parameter_count() const {
  const std::int64_t V = vocab_size, C = n_embd, L = n_layer, KC = kv_width(), F = ffn_hidden;
  const std::int64_t per_block = 2 * C + 2 * C * C + 2 * KC * C + 3 * F * C;
  return V * C + L * per_block + C + (tie_embeddings ? 0 : V * C);
}

double LlamaConfig::flops_per_token(int T) const {
  const double C = n_embd, KC = kv_width(), F = ffn_hidden;
  const double matmul_params = n_layer * (2 * C * C + 2 * KC * C + 3 * F * C) + static_cast<double>(vocab_size) * C;
  return 6.0 * matmul_params + 12.0 * n_layer * static_cast<double>(T) * n_embd;
}

void LlamaConfig::validate() const {
  FSDPP_REQUIRE(vocab_size >= 2, "model.vocab_size is {}; it must be at least 2", vocab_size);
  FSDPP_REQUIRE(context_length >= 1, "model.context_length is {}; it must be at least 1", context_length);
  FSDPP_REQUIRE(n_layer >= 1, "model.n_layer is {}; it must be at least 1", n_layer);
  FSDPP_REQUIRE(n_head >= 1 && n_embd >= 1 && n_embd % n_head == 0,
                "model.n_embd ({}) must be a positive multiple of model.n_head ({})", n_embd, n_head);
  FSDPP_REQUIRE(head_size() % 2 == 0, "model.n_embd / model.n_head is {}; RoPE rotates channel pairs, so the head "
                "size must be even", head_size());
  FSDPP_REQUIRE(n_kv_head >= 1 && n_head % n_kv_head == 0,
                "model.n_kv_head ({}) must divide model.n_head ({})", n_kv_head, n_head);
  FSDPP_REQUIRE(ffn_hidden >= 1, "model.ffn_hidden is {}; it must be at least 1", ffn_hidden);
  FSDPP_REQUIRE(rope_theta > 0, "model.rope_theta is {}; it must be positive", rope_theta);
  FSDPP_REQUIRE(norm_eps > 0, "model.norm_eps is {}; it must be positive", norm_eps);
  const kernels::RopeScaling& s = rope_scaling;
  FSDPP_REQUIRE(s.factor >= 1, "model.rope_scaling_factor is {}; it must be at least 1 (1: no scaling)", s.factor);
  FSDPP_REQUIRE(s.factor == 1 || (s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                                  s.original_context > 0),
                "model.rope_high_freq_factor ({}) must exceed model.rope_low_freq_factor ({}) > 0, and "
                "model.rope_original_context ({}) be positive", s.high_freq_factor, s.low_freq_factor,
                s.original_context);
}

// ---------------------------------------------------------------------------------------------------------
// Projections into and out of a packed [q | k | v] row: plain linear layers whose output (or output gradient)
// is a column slice of width OC at column `at` of rows of width W.

namespace {

// out[:, at:at+OC] = inp @ weight^T
void project_forward(const View1<float>& out, int W, int at, const View1<const float>& inp,
                     const View1<const float>& weight, int N, int C, int OC) {
  gemm<float>(Trans::N, Trans::T, N, OC, C, 1.0f, inp.data(), C, weight.data(), C, 0.0f, out.data() + at, W);
}

// dinp += dout[:, at:at+OC] @ weight;  dweight += dout[:, at:at+OC]^T @ inp
void project_backward(const View1<float>& dinp, const View1<float>& dweight, const View1<const float>& dout, int W,
                      int at, const View1<const float>& inp, const View1<const float>& weight, int N, int C, int OC) {
  gemm<float>(Trans::N, Trans::N, N, C, OC, 1.0f, dout.data() + at, W, weight.data(), C, 1.0f, dinp.data(), C);
  gemm<float>(Trans::T, Trans::N, OC, C, N, 1.0f, dout.data() + at, W, inp.data(), C, 1.0f, dweight.data(), C);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// LlamaBlock: x -> x + o_proj(attn(rope(qkv(rms_1(x))))) -> (that) + down(silu(gate(rms_2(that))) * up(rms_2(that)))

LlamaBlock::LlamaBlock(const LlamaConfig& c, std::shared_ptr<LlamaScratch> scratch, std::shared_ptr<RopeTables> rope,
                       std::shared_ptr<LlamaActivations> recomputed)
    : Module("LlamaBlock"),
      input_layernorm(add_parameter("input_layernorm.weight", {c.n_embd}, InitRule::ones(), ParamRole::norm)),
      q_proj(add_parameter("self_attn.q_proj.weight", {c.n_embd, c.n_embd}, InitRule::normal(kStd), ParamRole::weight)),
      k_proj(add_parameter("self_attn.k_proj.weight", {c.kv_width(), c.n_embd}, InitRule::normal(kStd), ParamRole::weight)),
      v_proj(add_parameter("self_attn.v_proj.weight", {c.kv_width(), c.n_embd}, InitRule::normal(kStd), ParamRole::weight)),
      // Residual projections are scaled by 1/sqrt(2L), as GPT-2's: each block adds two of them to the stream.
      o_proj(add_parameter("self_attn.o_proj.weight", {c.n_embd, c.n_embd},
                           InitRule::normal(kStd / std::sqrt(2.0f * c.n_layer)), ParamRole::weight)),
      post_attention_layernorm(add_parameter("post_attention_layernorm.weight", {c.n_embd}, InitRule::ones(), ParamRole::norm)),
      gate_proj(add_parameter("mlp.gate_proj.weight", {c.ffn_hidden, c.n_embd}, InitRule::normal(kStd), ParamRole::weight)),
      up_proj(add_parameter("mlp.up_proj.weight", {c.ffn_hidden, c.n_embd}, InitRule::normal(kStd), ParamRole::weight)),
      down_proj(add_parameter("mlp.down_proj.weight", {c.n_embd, c.ffn_hidden},
                              InitRule::normal(kStd / std::sqrt(2.0f * c.n_layer)), ParamRole::weight)),
      config_(c),
      scratch_(std::move(scratch)),
      rope_(std::move(rope)),
      tp_(std::make_shared<TensorParallelGroup>()),
      acts_(std::move(recomputed)) {}

void LlamaBlock::apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) {
  tp_ = std::move(tp);
  config_.tp = tp_->ranks();
  config_.sequence_parallel = tp_->sequence_parallel();
  for (Parameter* p : {&q_proj, &k_proj, &v_proj, &gate_proj, &up_proj}) p->set_tensor_parallel(tp_->shard(0));
  for (Parameter* p : {&o_proj, &down_proj}) p->set_tensor_parallel(tp_->shard(1));
}

// out = inp @ W^T for a Linear whose input features are split over tp: the partial products summed over tp
// (TensorParallelGroup::reduce_row_parallel). Without tensor parallelism, linear_forward itself.
void LlamaBlock::row_parallel_forward(const View1<float>& out, const View1<float>& inp, const Parameter& weight, int N,
                                      int in) {
  const int C = config_.n_embd;
  const View1<float> partial = config_.sequence_parallel ? scratch_->gathered : out;
  linear_forward<float>(partial, inp, weight.value(), View1<float>(), N, in, C);
  tp_->reduce_row_parallel(partial, out, N, C);
}


void LlamaActivations::ensure(const std::string& label, const LlamaConfig& c, int B, int T) {
  const std::size_t N = static_cast<std::size_t>(B) * T, C = c.n_embd, F = c.local_ffn(), Cl = c.local_width();
  const std::size_t Nl = static_cast<std::size_t>(c.local_rows(static_cast<std::int64_t>(N)));
  const std::size_t W = Cl + 2 * static_cast<std::size_t>(c.local_kv_width());
  const std::size_t attention = static_cast<std::size_t>(B) * c.local_heads() * T * attention_row_floats(c.attention, T);
  using Field = View1<float> LlamaActivations::*;  // an alias: nvcc's front end would parenthesize the declarator
  struct Member { Field view; const char* name; std::size_t count; };
  const Member members[] = {{&LlamaActivations::ln1, "ln1", N * C},   {&LlamaActivations::ln1_rstd, "ln1_rstd", Nl},
                            {&LlamaActivations::qkv, "qkv", N * W},   {&LlamaActivations::att, "att", attention},
                            {&LlamaActivations::atty, "atty", N * Cl}, {&LlamaActivations::res2, "res2", Nl * C},
                            {&LlamaActivations::ln2, "ln2", N * C},   {&LlamaActivations::ln2_rstd, "ln2_rstd", Nl},
                            {&LlamaActivations::gate, "gate", N * F}, {&LlamaActivations::up, "up", N * F},
                            {&LlamaActivations::h, "h", N * F}};
  storage_.resize(std::size(members));
  for (std::size_t i = 0; i < std::size(members); ++i) {
    const Member& m = members[i];
    if ((this->*m.view).data() && (this->*m.view).extent(0) == m.count) continue;  // the same shape again
    if (storage_[i].extent(0) < m.count) storage_[i] = uninitialized<float>(label + "." + m.name, m.count);
    // The front of the allocation: the same alignment, so the same kernels give the same bits.
    this->*m.view = Kokkos::subview(storage_[i], std::make_pair(std::size_t{0}, m.count));
  }
}

std::int64_t LlamaActivations::bytes() const {
  std::int64_t total = 0;
  for (const auto& v : storage_) total += static_cast<std::int64_t>(v.extent(0)) * 4;
  return total;
}

std::int64_t LlamaActivations::bytes_for(const LlamaConfig& c, int B, int T) {
  const std::int64_t N = std::int64_t{B} * T, C = c.n_embd, F = c.local_ffn(), Cl = c.local_width(), Nl = c.local_rows(N);
  const std::int64_t W = Cl + 2 * std::int64_t{c.local_kv_width()};
  const std::int64_t attention = std::int64_t{B} * c.local_heads() * T * attention_row_floats(c.attention, T);
  return 4 * (2 * N * C + N * Cl + Nl * C + 2 * Nl + N * W + attention + 3 * N * F);  // ln1, ln2; atty; res2
}

std::int64_t LlamaBlock::activation_bytes() const { return acts_.own_bytes() + bytes_of({&out_}); }

void LlamaBlock::ensure_output(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  out_ = uninitialized<float>(path() + ".out", static_cast<std::size_t>(config_.local_rows(std::int64_t{B} * T)) * config_.n_embd);
}

void LlamaBlock::forward(Flow& flow) {
  // This tp rank's heads and features (all of them without tensor parallelism): Cl = NH*hs/tp, KC, F, W.
  const int B = flow.B, T = flow.T, C = config_.n_embd, KC = config_.local_kv_width(), F = config_.local_ffn(), N = B * T;
  const int NH = config_.local_heads(), NKV = config_.local_kv_heads(), hs = config_.head_size();
  const int Cl = config_.local_width(), W = Cl + 2 * KC;
  const int Nl = static_cast<int>(config_.local_rows(N));  // rows of the residual stream here: N unless sequence parallel
  const bool sp = config_.sequence_parallel;
  const std::size_t local = static_cast<std::size_t>(Nl) * C;
  const double eps = config_.norm_eps;
  LlamaActivations& a = acts_.get(*this, config_, B, T);
  ensure_output(B, T);
  rope_->ensure(config_);
  in_ = flow.x;
  // Under sequence parallelism each norm writes its rows into its own block of the (N,C) buffer, which the
  // all-gather completes (as GPT's Block).
  rmsnorm_forward<float>(sp ? tp_->own_block(a.ln1, local) : a.ln1, a.ln1_rstd, in_, input_layernorm.value(), Nl, C, eps);
  if (sp) tp_->all_gather(a.ln1, local);
  project_forward(a.qkv, W, 0, a.ln1, q_proj.value(), N, C, Cl);
  project_forward(a.qkv, W, Cl, a.ln1, k_proj.value(), N, C, KC);
  project_forward(a.qkv, W, Cl + KC, a.ln1, v_proj.value(), N, C, KC);
  rope_forward<float>(a.qkv, rope_->cos, rope_->sin, B, T, W, NH + NKV, hs);  // q heads, then k heads
  // Only the batched kernels take the (shared) workspace; the others leave the scratch as it was.
  const bool batched = resolve_attention(config_.attention) == AttentionKind::batched;
  if (batched) scratch_->ensure(config_, B, T);
  attention_forward_as(config_.attention, a.atty, a.att, a.qkv, batched ? scratch_->attention_workspace : View1<float>(),
                       AttentionShape{B, T, NH, NKV, hs});
  // A recomputation rebuilds what backward reads and stops there (as GPT's Block): down_proj and the last
  // residual add only make the output, which backward does not read, so out_ stays as forward left it and
  // o_proj's output goes to the scratch d(res2), which backward overwrites before it reads it.
  View1<float> proj = out_;
  if (is_recomputing()) {
    scratch_->ensure(config_, B, T);
    proj = sp ? tp_->own_block(scratch_->dres2, local) : scratch_->dres2;
  }
  if (tp_->active() && !is_recomputing()) scratch_->ensure(config_, B, T);  // the partial sums' buffer
  row_parallel_forward(proj, a.atty, o_proj, N, Cl);
  residual_forward<float>(a.res2, in_, proj, Nl * C);
  rmsnorm_forward<float>(sp ? tp_->own_block(a.ln2, local) : a.ln2, a.ln2_rstd, a.res2, post_attention_layernorm.value(),
                         Nl, C, eps);
  if (sp) tp_->all_gather(a.ln2, local);
  linear_forward<float>(a.gate, a.ln2, gate_proj.value(), View1<float>(), N, C, F);
  linear_forward<float>(a.up, a.ln2, up_proj.value(), View1<float>(), N, C, F);
  swiglu_forward<float>(a.h, a.gate, a.up, std::int64_t{N} * F);
  if (is_recomputing()) return;
  row_parallel_forward(out_, a.h, down_proj, N, F);
  residual_forward<float>(out_, a.res2, out_, Nl * C);
  flow.x = out_;
}

// flow.dx holds d(out) on entry and d(in) on exit, in the same buffer (as Block::backward).
void LlamaBlock::backward(Flow& flow) {
  const int B = flow.B, T = flow.T, C = config_.n_embd, KC = config_.local_kv_width(), F = config_.local_ffn(), N = B * T;
  const int NH = config_.local_heads(), NKV = config_.local_kv_heads(), hs = config_.head_size();
  const int Cl = config_.local_width(), W = Cl + 2 * KC, Nl = static_cast<int>(config_.local_rows(N));
  const bool sp = config_.sequence_parallel;
  const std::size_t local = static_cast<std::size_t>(Nl) * C;
  LlamaScratch& s = *scratch_;
  s.ensure(config_, B, T);
  const LlamaActivations& a = acts_.get(*this, config_, B, T);
  const View1<float>& dout = flow.dx;
  const View1<float> none;
  if (sp) Kokkos::deep_copy(s.norm_grads, 0.0f);

  // MLP: out = res2 + down(silu(gate(rms_2(res2))) * up(rms_2(res2)))
  const View1<float> dout_rows = tp_->gather_rows(dout, s.gathered, N, C);  // (N,C): down_proj's output gradient
  Kokkos::deep_copy(s.dh, 0.0f);
  linear_backward<float>(s.dh, down_proj.grad(), none, dout_rows, a.h, down_proj.value(), N, F, C);
  Kokkos::deep_copy(s.dgate, 0.0f);
  Kokkos::deep_copy(s.dup, 0.0f);
  swiglu_backward<float>(s.dgate, s.dup, s.dh, a.gate, a.up, std::int64_t{N} * F);
  Kokkos::deep_copy(s.dln, 0.0f);
  linear_backward<float>(s.dln, gate_proj.grad(), none, s.dgate, a.ln2, gate_proj.value(), N, C, F);
  linear_backward<float>(s.dln, up_proj.grad(), none, s.dup, a.ln2, up_proj.value(), N, C, F);
  const View1<float> dln2 = tp_->reduce_region_gradient(s.dln, s.dln_local, N, C);  // every rank's features fed it
  const View1<float> dres2 = sp ? tp_->own_block(s.dres2, local) : s.dres2;  // this rank's rows (all without sp)
  Kokkos::deep_copy(dres2, dout);  // the residual path
  rmsnorm_backward<float>(dres2, tp_->norm_gradient(post_attention_layernorm, s.norm_grads, 1), dln2, a.res2, post_attention_layernorm.value(),
                          a.ln2_rstd, Nl, C);

  // Attention: res2 = in + o_proj(attn(rope(qkv(rms_1(in)))))
  if (sp) tp_->all_gather(s.dres2, local);  // o_proj's output gradient, every row
  Kokkos::deep_copy(s.datty, 0.0f);
  linear_backward<float>(s.datty, o_proj.grad(), none, s.dres2, a.atty, o_proj.value(), N, Cl, C);
  Kokkos::deep_copy(s.dqkv, 0.0f);
  attention_backward_as(config_.attention, s.dqkv, s.datt, s.datty, a.qkv, a.atty, a.att, s.attention_workspace,
                        AttentionShape{B, T, NH, NKV, hs});
  rope_backward<float>(s.dqkv, rope_->cos, rope_->sin, B, T, W, NH + NKV, hs);
  Kokkos::deep_copy(s.dln, 0.0f);
  project_backward(s.dln, q_proj.grad(), s.dqkv, W, 0, a.ln1, q_proj.value(), N, C, Cl);
  project_backward(s.dln, k_proj.grad(), s.dqkv, W, Cl, a.ln1, k_proj.value(), N, C, KC);
  project_backward(s.dln, v_proj.grad(), s.dqkv, W, Cl + KC, a.ln1, v_proj.value(), N, C, KC);
  const View1<float> dln1 = tp_->reduce_region_gradient(s.dln, s.dln_local, N, C);
  Kokkos::deep_copy(dout, dres2);  // the residual path, into the caller's buffer: d(out) is no longer needed
  rmsnorm_backward<float>(dout, tp_->norm_gradient(input_layernorm, s.norm_grads, 0), dln1, in_, input_layernorm.value(), a.ln1_rstd, Nl, C);
  // The norms saw this rank's rows only: their gradients summed over tp, then added.
  if (sp) tp_->add_norm_gradients(s.norm_grads, {input_layernorm.grad(), post_attention_layernorm.grad()});
}

// ---------------------------------------------------------------------------------------------------------
// Llama: tokens -> embed_tokens -> blocks -> norm -> logits = x lm_head^T (or embed_tokens) -> cross-entropy

Llama::Llama(const LlamaConfig& c)
    : LanguageModel("Llama"),
      embed_tokens(add_parameter("embed_tokens.weight", {c.vocab_size, c.n_embd}, InitRule::normal(kStd),
                                 ParamRole::embedding)),
      norm(add_parameter("norm.weight", {c.n_embd}, InitRule::ones(), ParamRole::norm)),
      lm_head(c.tie_embeddings ? nullptr
                               : &add_parameter("lm_head.weight", {c.vocab_size, c.n_embd}, InitRule::normal(kStd),
                                                ParamRole::weight)),
      config_(c),
      scratch_(std::make_shared<LlamaScratch>()),
      rope_(std::make_shared<RopeTables>()),
      recomputed_(std::make_shared<LlamaActivations>()),
      tp_(std::make_shared<TensorParallelGroup>()) {
  c.validate();
  for (int l = 0; l < c.n_layer; ++l) {
    blocks_.push_back(std::make_unique<LlamaBlock>(c, scratch_, rope_, recomputed_));
    add_child(*blocks_.back(), "layers." + std::to_string(l));
  }
}

void Llama::apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) {
  const LlamaConfig& c = config_;
  const int k = tp->ranks();
  FSDPP_REQUIRE(c.n_head % k == 0 && c.n_kv_head % k == 0, "mesh.tp ({}) must divide model.n_head ({}) and "
                "model.n_kv_head ({}): each tensor-parallel rank computes whole query and key/value heads", k,
                c.n_head, c.n_kv_head);
  FSDPP_REQUIRE(c.ffn_hidden % k == 0, "mesh.tp ({}) must divide the MLP width model.ffn_hidden ({})", k, c.ffn_hidden);
  tp->require_vocabulary_rows(c.vocab_size);
  tp_ = std::move(tp);
  config_.tp = k;
  config_.sequence_parallel = tp_->sequence_parallel();
  embed_tokens.set_tensor_parallel(tp_->shard(0));  // the vocabulary: embedding rows and logits columns
  if (lm_head) lm_head->set_tensor_parallel(tp_->shard(0));
  for (auto& block : blocks_) block->apply_tensor_parallel(tp_);
}

std::vector<LlamaBlock*> Llama::blocks() const {
  std::vector<LlamaBlock*> out;
  for (const auto& b : blocks_) out.push_back(b.get());
  return out;
}

std::vector<Module*> Llama::block_modules() const {
  std::vector<Module*> out;
  for (const auto& b : blocks_) out.push_back(b.get());
  return out;
}

std::string Llama::describe() const {
  const LlamaConfig& c = config_;
  const kernels::RopeScaling& s = c.rope_scaling;
  const std::string scaling = s.factor == 1 ? "" : fmt::format(" scaled x{} (llama3: low {} high {} original {})",
                                                               s.factor, s.low_freq_factor, s.high_freq_factor,
                                                               s.original_context);
  return fmt::format("Llama, V {} T {} C {} L {} NH {} NKV {} F {} rope_theta {}{} ({} embeddings)", c.vocab_size,
                     c.context_length, c.n_embd, c.n_layer, c.n_head, c.n_kv_head, c.ffn_hidden, c.rope_theta,
                     scaling, c.tie_embeddings ? "tied" : "untied");
}

std::int64_t Llama::activation_bytes() const {
  std::int64_t total = bytes_of({&x0_, &lnf_, &lnf_rstd_, &logits_, &losses_, &dlnf_, &dx_, &ce_stats_, &dlnf_local_,
                                 &norm_grads_});
  total += static_cast<std::int64_t>(local_tokens_.extent(0)) * 4;
  for (const auto& b : blocks_) total += b->activation_bytes();
  return total + recomputed_->bytes() + scratch_->bytes() + rope_->bytes();
}

std::int64_t Llama::activation_bytes_for(int B, int T, int recomputing_blocks) const {
  const LlamaConfig& c = config_;
  const std::int64_t N = std::int64_t{B} * T, C = c.n_embd, V = c.local_vocab(), F = c.local_ffn();
  const std::int64_t Cl = c.local_width(), W = Cl + 2 * std::int64_t{c.local_kv_width()}, Nl = c.local_rows(N);
  const std::int64_t attention = std::int64_t{B} * c.local_heads() * T * attention_row_floats(c.attention, T);
  const std::int64_t outputs = 4 * c.n_layer * Nl * C;                        // LlamaBlock::ensure_output
  const std::int64_t recomputable = LlamaActivations::bytes_for(c, B, T);     // per block that keeps its own...
  const std::int64_t sets = c.n_layer - recomputing_blocks + (recomputing_blocks > 0 ? 1 : 0);  // ...+ one shared
  // Llama::ensure_activations: x0, dx (Nl rows), lnf, dlnf (N,C), lnf_rstd (Nl), losses, logits; tensor and
  // sequence parallelism's buffers.
  const std::int64_t vocab_parallel = c.tp > 1 ? 4 * (N + 3 * N) : 0;
  const std::int64_t sequence_parallel = c.sequence_parallel ? 4 * (Nl * C + C) : 0;
  const std::int64_t head = 4 * (2 * Nl * C + 2 * N * C + Nl + N + N * V) + vocab_parallel + sequence_parallel;
  const std::int64_t workspace = attention_workspace_floats(c.attention, B, T, static_cast<int>(W), static_cast<int>(Cl));
  const std::int64_t block_sp = c.sequence_parallel ? N * C + Nl * C + 2 * C : 0;
  const std::int64_t scratch = 4 * (2 * N * C + N * Cl + N * W + attention + 3 * N * F + workspace + block_sp);
  const std::int64_t rope = 4 * std::int64_t{c.context_length} * (c.head_size() / 2) * 2;  // RopeTables
  return outputs + sets * recomputable + head + scratch + rope;
}

void Llama::ensure_activations(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  const std::size_t N = static_cast<std::size_t>(B) * T, C = config_.n_embd;
  const std::size_t Nl = static_cast<std::size_t>(config_.local_rows(static_cast<std::int64_t>(N)));
  x0_ = uninitialized<float>("llama.x0", Nl * C);
  lnf_ = uninitialized<float>("llama.lnf", N * C);
  lnf_rstd_ = uninitialized<float>("llama.lnf_rstd", Nl);
  logits_ = uninitialized<float>("llama.logits", N * static_cast<std::size_t>(head().rows()));  // this rank's vocabulary
  losses_ = uninitialized<float>("llama.losses", N);
  dlnf_ = uninitialized<float>("llama.dlnf", N * C);
  dx_ = uninitialized<float>("llama.dx", Nl * C);
  if (config_.sequence_parallel) {
    dlnf_local_ = uninitialized<float>("llama.dlnf_local", Nl * C);
    norm_grads_ = uninitialized<float>("llama.norm_grads", C);
  }
  if (tp_->active()) {
    local_tokens_ = View1<std::int32_t>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "llama.local_tokens"), N);
    ce_stats_ = uninitialized<float>("llama.ce_stats", 3 * N);
  }
}

void Llama::forward(Flow& flow) {
  const int B = flow.B, T = flow.T, C = config_.n_embd, V = config_.vocab_size, N = B * T;
  FSDPP_REQUIRE(T >= 1 && T <= config_.context_length, "sequence length {} exceeds model.context_length {}", T,
                config_.context_length);
  const bool sp = config_.sequence_parallel;
  FSDPP_REQUIRE(!sp || N % tp_->ranks() == 0, "mesh.tp_sequence_parallel splits a micro-batch's {} x {} = {} tokens "
                "over mesh.tp = {} ranks, which does not divide them: choose train.micro_batch and the sequence length "
                "so that B x T is a multiple of {}", B, T, N, tp_->ranks(), tp_->ranks());
  const int Nl = static_cast<int>(config_.local_rows(N));
  const std::size_t local = static_cast<std::size_t>(Nl) * C;
  ensure_activations(B, T);
  if (tp_->active()) {
    // Tokens another rank holds get zero rows here; the (N,C) partial sums are reduced over tp (lnf_ is their
    // buffer under sequence parallelism: it is free until the final norm).
    localize_tokens(local_tokens_, flow.tokens, tp_->vocab_offset(config_.vocab_size), N);
    const View1<float> partial = sp ? lnf_ : x0_;
    embedding_forward<float>(partial, local_tokens_, embed_tokens.value(), N, C);
    tp_->reduce_row_parallel(partial, x0_, N, C);
  } else {
    embedding_forward<float>(x0_, flow.tokens, embed_tokens.value(), N, C);
  }
  flow.x = x0_;
  for (auto& block : blocks_) (*block)(flow);
  final_x_ = flow.x;
  rmsnorm_forward<float>(sp ? tp_->own_block(lnf_, local) : lnf_, lnf_rstd_, final_x_, norm.value(), Nl, C,
                         config_.norm_eps);
  if (sp) tp_->all_gather(lnf_, local);  // the LM head reads every row
  const int Vl = static_cast<int>(head().rows());  // V without tensor parallelism
  linear_forward<float>(logits_, lnf_, head().value(), View1<float>(), N, C, Vl);
  // Training: the fused kernel leaves d(loss)/d(logits) in logits_, saving a (B*T,V) buffer.
  if (tp_->active())
    tp_->vocab_parallel_loss(logits_, losses_, ce_stats_, flow.targets, N, Vl, V, flow.loss_scale, flow.training);
  else if (flow.training)
    crossentropy_forward_backward<float>(logits_, losses_, flow.targets, N, V, flow.loss_scale / static_cast<float>(N));
  else
    crossentropy_forward<float>(losses_, logits_, flow.targets, N, V);
  flow.loss = mean_loss(losses_, N);
}

void Llama::backward(Flow& flow) {
  const int C = config_.n_embd, N = flow.B * flow.T, Vl = static_cast<int>(head().rows());
  const bool sp = config_.sequence_parallel;
  const int Nl = static_cast<int>(config_.local_rows(N));
  FSDPP_CHECK(flow.training, "backward after a forward with training = false: the loss gradient was not prepared");
  Kokkos::deep_copy(dlnf_, 0.0f);
  linear_backward<float>(dlnf_, head().grad(), View1<float>(), logits_, lnf_, head().value(), N, C, Vl);
  // Every rank's vocabulary columns contributed to d(lnf): summed, or under sp reduce-scattered to this rank's rows.
  const View1<float> dlnf = tp_->reduce_region_gradient(dlnf_, dlnf_local_, N, C);
  Kokkos::deep_copy(dx_, 0.0f);
  if (sp) Kokkos::deep_copy(norm_grads_, 0.0f);
  rmsnorm_backward<float>(dx_, tp_->norm_gradient(norm, norm_grads_, 0), dlnf, final_x_, norm.value(), lnf_rstd_, Nl, C);
  if (sp) tp_->add_norm_gradients(norm_grads_, {norm.grad()});  // each rank saw its rows only
  flow.dx = dx_;
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) (**it)(flow, Pass::backward);
  // The embedding's gradient needs every row (under sp gathered into dlnf_, free again); tokens another rank
  // holds fall outside this rank's rows and are skipped.
  const View1<float> dx = tp_->gather_rows(flow.dx, dlnf_, N, C);
  embedding_backward<float>(embed_tokens.grad(), dx, tp_->active() ? View1<const std::int32_t>(local_tokens_) : flow.tokens,
                            N, C);
}

}  // namespace fsdpp
