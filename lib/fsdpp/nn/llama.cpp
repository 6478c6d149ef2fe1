#include "fsdpp/nn/llama.hpp"

#include "fsdpp/nn/attention_dispatch.hpp"
#include "fsdpp/nn/kernels/crossentropy.hpp"
#include "fsdpp/nn/kernels/embedding.hpp"
#include "fsdpp/nn/kernels/linear.hpp"
#include "fsdpp/nn/kernels/residual.hpp"
#include "fsdpp/nn/kernels/rmsnorm.hpp"
#include "fsdpp/nn/kernels/rope.hpp"
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

  void ensure(const LlamaConfig& c, int B_, int T_) {
    if (B == B_ && T == T_) return;
    B = B_, T = T_;
    const std::size_t N = static_cast<std::size_t>(B) * T, C = c.n_embd, F = c.ffn_hidden;
    const std::size_t W = C + 2 * static_cast<std::size_t>(c.kv_width());
    dres2 = uninitialized<float>("llama_block.dres2", N * C);
    dln = uninitialized<float>("llama_block.dln", N * C);
    dqkv = uninitialized<float>("llama_block.dqkv", N * W);
    datty = uninitialized<float>("llama_block.datty", N * C);
    datt = uninitialized<float>("llama_block.datt",
                                static_cast<std::size_t>(B) * c.n_head * T * attention_row_floats(c.attention, T));
    dh = uninitialized<float>("llama_block.dh", N * F);
    dgate = uninitialized<float>("llama_block.dgate", N * F);
    dup = uninitialized<float>("llama_block.dup", N * F);
    attention_workspace = uninitialized<float>(
        "llama_block.attention_workspace",
        static_cast<std::size_t>(attention_workspace_floats(c.attention, B, T, static_cast<int>(W), static_cast<int>(C))));
  }
  std::int64_t bytes() const {
    return bytes_of({&dres2, &dln, &dqkv, &datty, &datt, &dh, &dgate, &dup, &attention_workspace});
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
      acts_(std::move(recomputed)) {}

void LlamaActivations::ensure(const std::string& label, const LlamaConfig& c, int B, int T) {
  const std::size_t N = static_cast<std::size_t>(B) * T, C = c.n_embd, F = c.ffn_hidden;
  const std::size_t W = C + 2 * static_cast<std::size_t>(c.kv_width());
  const std::size_t attention = static_cast<std::size_t>(B) * c.n_head * T * attention_row_floats(c.attention, T);
  using Field = View1<float> LlamaActivations::*;  // an alias: nvcc's front end would parenthesize the declarator
  struct Member { Field view; const char* name; std::size_t count; };
  const Member members[] = {{&LlamaActivations::ln1, "ln1", N * C},   {&LlamaActivations::ln1_rstd, "ln1_rstd", N},
                            {&LlamaActivations::qkv, "qkv", N * W},   {&LlamaActivations::att, "att", attention},
                            {&LlamaActivations::atty, "atty", N * C}, {&LlamaActivations::res2, "res2", N * C},
                            {&LlamaActivations::ln2, "ln2", N * C},   {&LlamaActivations::ln2_rstd, "ln2_rstd", N},
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
  const std::int64_t N = std::int64_t{B} * T, C = c.n_embd, F = c.ffn_hidden;
  const std::int64_t W = C + 2 * std::int64_t{c.kv_width()};
  const std::int64_t attention = std::int64_t{B} * c.n_head * T * attention_row_floats(c.attention, T);
  return 4 * (4 * N * C + 2 * N + N * W + attention + 3 * N * F);
}

std::int64_t LlamaBlock::activation_bytes() const { return acts_.own_bytes() + bytes_of({&out_}); }

void LlamaBlock::ensure_output(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  out_ = uninitialized<float>(path() + ".out", static_cast<std::size_t>(B) * T * config_.n_embd);
}

void LlamaBlock::forward(Flow& flow) {
  const int B = flow.B, T = flow.T, C = config_.n_embd, KC = config_.kv_width(), F = config_.ffn_hidden, N = B * T;
  const int NH = config_.n_head, NKV = config_.n_kv_head, hs = config_.head_size(), W = C + 2 * KC;
  const double eps = config_.norm_eps;
  LlamaActivations& a = acts_.get(*this, config_, B, T);
  ensure_output(B, T);
  rope_->ensure(config_);
  in_ = flow.x;
  rmsnorm_forward<float>(a.ln1, a.ln1_rstd, in_, input_layernorm.value(), N, C, eps);
  project_forward(a.qkv, W, 0, a.ln1, q_proj.value(), N, C, C);
  project_forward(a.qkv, W, C, a.ln1, k_proj.value(), N, C, KC);
  project_forward(a.qkv, W, C + KC, a.ln1, v_proj.value(), N, C, KC);
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
    proj = scratch_->dres2;
  }
  linear_forward<float>(proj, a.atty, o_proj.value(), View1<float>(), N, C, C);
  residual_forward<float>(a.res2, in_, proj, N * C);
  rmsnorm_forward<float>(a.ln2, a.ln2_rstd, a.res2, post_attention_layernorm.value(), N, C, eps);
  linear_forward<float>(a.gate, a.ln2, gate_proj.value(), View1<float>(), N, C, F);
  linear_forward<float>(a.up, a.ln2, up_proj.value(), View1<float>(), N, C, F);
  swiglu_forward<float>(a.h, a.gate, a.up, std::int64_t{N} * F);
  if (is_recomputing()) return;
  linear_forward<float>(out_, a.h, down_proj.value(), View1<float>(), N, F, C);
  residual_forward<float>(out_, a.res2, out_, N * C);
  flow.x = out_;
}

// flow.dx holds d(out) on entry and d(in) on exit, in the same buffer (as Block::backward).
void LlamaBlock::backward(Flow& flow) {
  const int B = flow.B, T = flow.T, C = config_.n_embd, KC = config_.kv_width(), F = config_.ffn_hidden, N = B * T;
  const int NH = config_.n_head, NKV = config_.n_kv_head, hs = config_.head_size(), W = C + 2 * KC;
  LlamaScratch& s = *scratch_;
  s.ensure(config_, B, T);
  const LlamaActivations& a = acts_.get(*this, config_, B, T);
  const View1<float>& dout = flow.dx;
  const View1<float> none;

  // MLP: out = res2 + down(silu(gate(rms_2(res2))) * up(rms_2(res2)))
  Kokkos::deep_copy(s.dh, 0.0f);
  linear_backward<float>(s.dh, down_proj.grad(), none, dout, a.h, down_proj.value(), N, F, C);
  Kokkos::deep_copy(s.dgate, 0.0f);
  Kokkos::deep_copy(s.dup, 0.0f);
  swiglu_backward<float>(s.dgate, s.dup, s.dh, a.gate, a.up, std::int64_t{N} * F);
  Kokkos::deep_copy(s.dln, 0.0f);
  linear_backward<float>(s.dln, gate_proj.grad(), none, s.dgate, a.ln2, gate_proj.value(), N, C, F);
  linear_backward<float>(s.dln, up_proj.grad(), none, s.dup, a.ln2, up_proj.value(), N, C, F);
  Kokkos::deep_copy(s.dres2, dout);  // the residual path
  rmsnorm_backward<float>(s.dres2, post_attention_layernorm.grad(), s.dln, a.res2, post_attention_layernorm.value(),
                          a.ln2_rstd, N, C);

  // Attention: res2 = in + o_proj(attn(rope(qkv(rms_1(in)))))
  Kokkos::deep_copy(s.datty, 0.0f);
  linear_backward<float>(s.datty, o_proj.grad(), none, s.dres2, a.atty, o_proj.value(), N, C, C);
  Kokkos::deep_copy(s.dqkv, 0.0f);
  attention_backward_as(config_.attention, s.dqkv, s.datt, s.datty, a.qkv, a.atty, a.att, s.attention_workspace,
                        AttentionShape{B, T, NH, NKV, hs});
  rope_backward<float>(s.dqkv, rope_->cos, rope_->sin, B, T, W, NH + NKV, hs);
  Kokkos::deep_copy(s.dln, 0.0f);
  project_backward(s.dln, q_proj.grad(), s.dqkv, W, 0, a.ln1, q_proj.value(), N, C, C);
  project_backward(s.dln, k_proj.grad(), s.dqkv, W, C, a.ln1, k_proj.value(), N, C, KC);
  project_backward(s.dln, v_proj.grad(), s.dqkv, W, C + KC, a.ln1, v_proj.value(), N, C, KC);
  Kokkos::deep_copy(dout, s.dres2);  // the residual path, into the caller's buffer: d(out) is no longer needed
  rmsnorm_backward<float>(dout, input_layernorm.grad(), s.dln, in_, input_layernorm.value(), a.ln1_rstd, N, C);
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
      recomputed_(std::make_shared<LlamaActivations>()) {
  c.validate();
  for (int l = 0; l < c.n_layer; ++l) {
    blocks_.push_back(std::make_unique<LlamaBlock>(c, scratch_, rope_, recomputed_));
    add_child(*blocks_.back(), "layers." + std::to_string(l));
  }
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
  std::int64_t total = bytes_of({&x0_, &lnf_, &lnf_rstd_, &logits_, &losses_, &dlnf_, &dx_});
  for (const auto& b : blocks_) total += b->activation_bytes();
  return total + recomputed_->bytes() + scratch_->bytes() + rope_->bytes();
}

std::int64_t Llama::activation_bytes_for(int B, int T, int recomputing_blocks) const {
  const LlamaConfig& c = config_;
  const std::int64_t N = std::int64_t{B} * T, C = c.n_embd, V = c.vocab_size, F = c.ffn_hidden;
  const std::int64_t W = C + 2 * std::int64_t{c.kv_width()};
  const std::int64_t attention = std::int64_t{B} * c.n_head * T * attention_row_floats(c.attention, T);
  const std::int64_t outputs = 4 * c.n_layer * N * C;                         // LlamaBlock::ensure_output
  const std::int64_t recomputable = LlamaActivations::bytes_for(c, B, T);     // per block that keeps its own...
  const std::int64_t sets = c.n_layer - recomputing_blocks + (recomputing_blocks > 0 ? 1 : 0);  // ...+ one shared
  const std::int64_t head = 4 * (4 * N * C + 2 * N + N * V);                  // Llama::ensure_activations
  const std::int64_t workspace = attention_workspace_floats(c.attention, B, T, static_cast<int>(W), static_cast<int>(C));
  const std::int64_t scratch = 4 * (3 * N * C + N * W + attention + 3 * N * F + workspace);  // LlamaScratch::ensure
  const std::int64_t rope = 4 * std::int64_t{c.context_length} * (c.head_size() / 2) * 2;  // RopeTables
  return outputs + sets * recomputable + head + scratch + rope;
}

void Llama::ensure_activations(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  const std::size_t N = static_cast<std::size_t>(B) * T, C = config_.n_embd;
  x0_ = uninitialized<float>("llama.x0", N * C);
  lnf_ = uninitialized<float>("llama.lnf", N * C);
  lnf_rstd_ = uninitialized<float>("llama.lnf_rstd", N);
  logits_ = uninitialized<float>("llama.logits", N * static_cast<std::size_t>(config_.vocab_size));
  losses_ = uninitialized<float>("llama.losses", N);
  dlnf_ = uninitialized<float>("llama.dlnf", N * C);
  dx_ = uninitialized<float>("llama.dx", N * C);
}

void Llama::forward(Flow& flow) {
  const int B = flow.B, T = flow.T, C = config_.n_embd, V = config_.vocab_size, N = B * T;
  FSDPP_REQUIRE(T >= 1 && T <= config_.context_length, "sequence length {} exceeds model.context_length {}", T,
                config_.context_length);
  ensure_activations(B, T);
  embedding_forward<float>(x0_, flow.tokens, embed_tokens.value(), N, C);
  flow.x = x0_;
  for (auto& block : blocks_) (*block)(flow);
  final_x_ = flow.x;
  rmsnorm_forward<float>(lnf_, lnf_rstd_, final_x_, norm.value(), N, C, config_.norm_eps);
  linear_forward<float>(logits_, lnf_, head().value(), View1<float>(), N, C, V);
  // Training: the fused kernel leaves d(loss)/d(logits) in logits_, saving a (B*T,V) buffer.
  if (flow.training)
    crossentropy_forward_backward<float>(logits_, losses_, flow.targets, N, V, flow.loss_scale / static_cast<float>(N));
  else
    crossentropy_forward<float>(losses_, logits_, flow.targets, N, V);
  flow.loss = mean_loss(losses_, N);
}

void Llama::backward(Flow& flow) {
  const int C = config_.n_embd, V = config_.vocab_size, N = flow.B * flow.T;
  FSDPP_CHECK(flow.training, "backward after a forward with training = false: the loss gradient was not prepared");
  Kokkos::deep_copy(dlnf_, 0.0f);
  linear_backward<float>(dlnf_, head().grad(), View1<float>(), logits_, lnf_, head().value(), N, C, V);
  Kokkos::deep_copy(dx_, 0.0f);
  rmsnorm_backward<float>(dx_, norm.grad(), dlnf_, final_x_, norm.value(), lnf_rstd_, N, C);
  flow.dx = dx_;
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) (**it)(flow, Pass::backward);
  embedding_backward<float>(embed_tokens.grad(), flow.dx, flow.tokens, N, C);
}

}  // namespace fsdpp
