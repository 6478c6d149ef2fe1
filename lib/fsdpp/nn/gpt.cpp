#include "fsdpp/nn/gpt.hpp"

#include "fsdpp/nn/attention_dispatch.hpp"
#include "fsdpp/nn/kernels/crossentropy.hpp"
#include "fsdpp/nn/kernels/encoder.hpp"
#include "fsdpp/nn/kernels/gelu.hpp"
#include "fsdpp/nn/kernels/layernorm.hpp"
#include "fsdpp/nn/kernels/linear.hpp"
#include "fsdpp/nn/kernels/residual.hpp"
#include "fsdpp/nn/kernels/vocab_parallel.hpp"
#include "fsdpp/runtime/error.hpp"

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
}  // namespace

struct BlockScratch {
  int B = 0, T = 0;
  View1<float> dres2;     // (B,T,C) gradient of the residual after attention
  View1<float> dln;       // (B,T,C) gradient of a LayerNorm output
  View1<float> dqkv;      // (B,T,3C)
  View1<float> datty;     // (B,T,C)
  View1<float> datt;      // (B,NH,T,T); fused: (B,NH,T), the row term D
  View1<float> dfch;      // (B,T,4C)
  View1<float> dfch_gelu; // (B,T,4C)
  View1<float> attention_workspace;  // model.attention batched: attention_workspace_floats, else empty
  // Sequence parallelism only (empty otherwise): dres2 then holds the gathered (N,C) gradient, this rank's rows
  // in its own block.
  View1<float> gathered;   // (B,T,C): a gathered gradient, or a row-parallel layer's partial sums
  View1<float> dln_local;  // (Nl,C): a norm output's gradient, reduce-scattered
  View1<float> norm_grads; // (4C): ln_1 and ln_2 gradients of one backward, before their all-reduce

  void ensure(const GptConfig& c, int B_, int T_) {
    if (B == B_ && T == T_) return;
    B = B_, T = T_;
    // Tensor parallelism: the attention and MLP buffers hold this rank's heads and features (Cl = C/tp).
    const std::size_t N = static_cast<std::size_t>(B) * T, C = c.n_embd, Cl = c.local_width();
    dres2 = uninitialized<float>("block.dres2", N * C);
    dln = uninitialized<float>("block.dln", N * C);
    dqkv = uninitialized<float>("block.dqkv", N * 3 * Cl);
    datty = uninitialized<float>("block.datty", N * Cl);
    datt = uninitialized<float>("block.datt",
                                static_cast<std::size_t>(B) * c.local_heads() * T * attention_row_floats(c.attention, T));
    dfch = uninitialized<float>("block.dfch", N * 4 * Cl);
    dfch_gelu = uninitialized<float>("block.dfch_gelu", N * 4 * Cl);
    attention_workspace = uninitialized<float>(
        "block.attention_workspace", static_cast<std::size_t>(attention_workspace_floats(c.attention, B, T, 3 * Cl, Cl)));
    if (c.sequence_parallel) {
      gathered = uninitialized<float>("block.gathered", N * C);
      dln_local = uninitialized<float>("block.dln_local", static_cast<std::size_t>(c.local_rows(N)) * C);
      norm_grads = uninitialized<float>("block.norm_grads", 4 * C);
    }
  }
};

// ---------------------------------------------------------------------------------------------------------
// Config

std::int64_t GptConfig::parameter_count() const {
  const std::int64_t V = vocab_size, C = n_embd, L = n_layer, Tm = context_length;
  const std::int64_t per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  return V * C + Tm * C + L * per_block + 2 * C + (tie_embeddings ? 0 : V * C);
}

double GptConfig::flops_per_token(int T) const {
  // wpe is a lookup and costs no multiply-adds; so is wte when the head has its own weight.
  const double matmul_params = static_cast<double>(parameter_count()) - static_cast<double>(context_length) * n_embd -
                               (tie_embeddings ? 0.0 : static_cast<double>(vocab_size) * n_embd);
  return 6.0 * matmul_params + 12.0 * n_layer * static_cast<double>(T) * n_embd;
}

void GptConfig::validate() const {
  FSDPP_REQUIRE(vocab_size >= 2, "model.vocab_size is {}; it must be at least 2", vocab_size);
  FSDPP_REQUIRE(context_length >= 1, "model.context_length is {}; it must be at least 1", context_length);
  FSDPP_REQUIRE(n_layer >= 1, "model.n_layer is {}; it must be at least 1", n_layer);
  FSDPP_REQUIRE(n_head >= 1 && n_embd >= 1 && n_embd % n_head == 0,
                "model.n_embd ({}) must be a positive multiple of model.n_head ({})", n_embd, n_head);
}

// ---------------------------------------------------------------------------------------------------------
// Block: x -> x + attn(ln_1(x)) -> (that) + mlp(ln_2(that))

namespace {
const float kStd = 0.02f;
}

Block::Block(const GptConfig& c, std::shared_ptr<BlockScratch> scratch, std::shared_ptr<BlockActivations> recomputed)
    : Module("Block"),
      ln_1_weight(add_parameter("ln_1.weight", {c.n_embd}, InitRule::ones(), ParamRole::norm)),
      ln_1_bias(add_parameter("ln_1.bias", {c.n_embd}, InitRule::zeros(), ParamRole::bias)),
      c_attn_weight(add_parameter("attn.c_attn.weight", {3 * c.n_embd, c.n_embd}, InitRule::normal(kStd), ParamRole::weight)),
      c_attn_bias(add_parameter("attn.c_attn.bias", {3 * c.n_embd}, InitRule::zeros(), ParamRole::bias)),
      // Residual projections are scaled by 1/sqrt(2L): each block adds two of them to the residual stream.
      attn_proj_weight(add_parameter("attn.c_proj.weight", {c.n_embd, c.n_embd},
                                     InitRule::normal(kStd / std::sqrt(2.0f * c.n_layer)), ParamRole::weight)),
      attn_proj_bias(add_parameter("attn.c_proj.bias", {c.n_embd}, InitRule::zeros(), ParamRole::bias)),
      ln_2_weight(add_parameter("ln_2.weight", {c.n_embd}, InitRule::ones(), ParamRole::norm)),
      ln_2_bias(add_parameter("ln_2.bias", {c.n_embd}, InitRule::zeros(), ParamRole::bias)),
      c_fc_weight(add_parameter("mlp.c_fc.weight", {4 * c.n_embd, c.n_embd}, InitRule::normal(kStd), ParamRole::weight)),
      c_fc_bias(add_parameter("mlp.c_fc.bias", {4 * c.n_embd}, InitRule::zeros(), ParamRole::bias)),
      mlp_proj_weight(add_parameter("mlp.c_proj.weight", {c.n_embd, 4 * c.n_embd},
                                    InitRule::normal(kStd / std::sqrt(2.0f * c.n_layer)), ParamRole::weight)),
      mlp_proj_bias(add_parameter("mlp.c_proj.bias", {c.n_embd}, InitRule::zeros(), ParamRole::bias)),
      config_(c),
      scratch_(std::move(scratch)),
      tp_(std::make_shared<TensorParallelGroup>()),
      acts_(std::move(recomputed)) {}

void Block::apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) {
  tp_ = std::move(tp);
  config_.tp = tp_->ranks();
  config_.sequence_parallel = tp_->sequence_parallel();
  c_attn_weight.set_tensor_parallel(tp_->shard(0, 3));  // q, k and v of this rank's heads
  c_attn_bias.set_tensor_parallel(tp_->shard(0, 3));
  attn_proj_weight.set_tensor_parallel(tp_->shard(1));
  c_fc_weight.set_tensor_parallel(tp_->shard(0));
  c_fc_bias.set_tensor_parallel(tp_->shard(0));
  mlp_proj_weight.set_tensor_parallel(tp_->shard(1));
}

void BlockActivations::ensure(const std::string& label, const GptConfig& c, int B, int T) {
  const std::size_t N = static_cast<std::size_t>(B) * T, C = c.n_embd, Cl = c.local_width();
  const std::size_t Nl = static_cast<std::size_t>(c.local_rows(static_cast<std::int64_t>(N)));  // N unless sequence parallel
  const std::size_t attention = static_cast<std::size_t>(B) * c.local_heads() * T * attention_row_floats(c.attention, T);
  using Field = View1<float> BlockActivations::*;  // an alias: nvcc's front end would parenthesize the declarator
  struct Member { Field view; const char* name; std::size_t count; };
  const Member members[] = {{&BlockActivations::ln1, "ln1", N * C},       {&BlockActivations::ln1_mean, "ln1_mean", Nl},
                            {&BlockActivations::ln1_rstd, "ln1_rstd", Nl}, {&BlockActivations::qkv, "qkv", N * 3 * Cl},
                            {&BlockActivations::att, "att", attention},   {&BlockActivations::atty, "atty", N * Cl},
                            {&BlockActivations::res2, "res2", Nl * C},     {&BlockActivations::ln2, "ln2", N * C},
                            {&BlockActivations::ln2_mean, "ln2_mean", Nl}, {&BlockActivations::ln2_rstd, "ln2_rstd", Nl},
                            {&BlockActivations::fch, "fch", N * 4 * Cl},  {&BlockActivations::fch_gelu, "fch_gelu", N * 4 * Cl}};
  storage_.resize(std::size(members));
  for (std::size_t i = 0; i < std::size(members); ++i) {
    const Member& m = members[i];
    if ((this->*m.view).data() && (this->*m.view).extent(0) == m.count) continue;  // the usual case: the same shape again
    if (storage_[i].extent(0) < m.count) storage_[i] = uninitialized<float>(label + "." + m.name, m.count);
    // The front of the allocation: the same alignment, so the same kernels give the same bits.
    this->*m.view = Kokkos::subview(storage_[i], std::make_pair(std::size_t{0}, m.count));
  }
}

std::int64_t BlockActivations::bytes() const {
  std::int64_t total = 0;
  for (const auto& v : storage_) total += static_cast<std::int64_t>(v.extent(0)) * 4;
  return total;
}

std::int64_t BlockActivations::bytes_for(const GptConfig& c, int B, int T) {
  const std::int64_t N = std::int64_t{B} * T, C = c.n_embd, Cl = c.local_width(), Nl = c.local_rows(N);
  const std::int64_t attention = std::int64_t{B} * c.local_heads() * T * attention_row_floats(c.attention, T);
  return 4 * (2 * N * C + Nl * C + 12 * N * Cl + 4 * Nl + attention);  // ln1, ln2; res2; qkv, atty, fch, fch_gelu
}

std::int64_t Block::activation_bytes() const {
  return acts_.own_bytes() + static_cast<std::int64_t>(out_.extent(0)) * 4;
}

BlockScratch& Block::scratch_for(int B, int T) {
  scratch_->ensure(config_, B, T);
  return *scratch_;
}

void Block::ensure_output(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  out_ = uninitialized<float>(path() + ".out", static_cast<std::size_t>(config_.local_rows(std::int64_t{B} * T)) * config_.n_embd);
}

void Block::forward(Flow& flow) {
  const int B = flow.B, T = flow.T, C = config_.n_embd, NH = config_.n_head, N = B * T;
  const int Cl = config_.local_width(), NHl = config_.local_heads();  // this tp rank's (all of them without tp)
  const int Nl = static_cast<int>(config_.local_rows(N));  // rows of the residual stream here: N unless sequence parallel
  const bool sp = config_.sequence_parallel;
  BlockActivations& a = acts_.get(*this, config_, B, T);
  ensure_output(B, T);
  in_ = flow.x;
  // Under sequence parallelism each norm writes its rows into its own block of the (N,C) buffer, which the
  // all-gather then completes: the input of the tensor-parallel region that follows.
  const std::size_t local = static_cast<std::size_t>(Nl) * C;
  layernorm_forward<float>(sp ? tp_->own_block(a.ln1, local) : a.ln1, a.ln1_mean, a.ln1_rstd, in_,
                           ln_1_weight.value(), ln_1_bias.value(), Nl, C);
  if (sp) tp_->all_gather(a.ln1, local);
  linear_forward<float>(a.qkv, a.ln1, c_attn_weight.value(), c_attn_bias.value(), N, C, 3 * Cl);
  // Only the batched kernels take the (shared) workspace; the others leave the scratch as it was.
  const bool batched = resolve_attention(config_.attention) == AttentionKind::batched;
  attention_forward_as(config_.attention, a.atty, a.att, a.qkv,
                       batched ? scratch_for(B, T).attention_workspace : View1<float>(),
                       AttentionShape{B, T, NHl, NHl, C / NH});
  // A recomputation rebuilds what backward reads and stops there: the MLP's c_proj and the last residual add
  // only make the output, which backward does not read (the next block, whose input it is, is already through
  // its backward). So out_ stays as forward left it, and the attention projection goes to the scratch d(res2),
  // which backward overwrites before it reads it.
  const View1<float> scratch = scratch_for(B, T).dres2;
  const View1<float> proj = !is_recomputing() ? out_ : sp ? tp_->own_block(scratch, local) : scratch;
  row_parallel_forward(proj, a.atty, attn_proj_weight, attn_proj_bias, N, Cl, C);
  residual_forward<float>(a.res2, in_, proj, Nl * C);
  layernorm_forward<float>(sp ? tp_->own_block(a.ln2, local) : a.ln2, a.ln2_mean, a.ln2_rstd, a.res2,
                           ln_2_weight.value(), ln_2_bias.value(), Nl, C);
  if (sp) tp_->all_gather(a.ln2, local);
  linear_forward<float>(a.fch, a.ln2, c_fc_weight.value(), c_fc_bias.value(), N, C, 4 * Cl);
  gelu_forward<float>(a.fch_gelu, a.fch, N * 4 * Cl);
  if (is_recomputing()) return;
  row_parallel_forward(out_, a.fch_gelu, mlp_proj_weight, mlp_proj_bias, N, 4 * Cl, C);
  residual_forward<float>(out_, a.res2, out_, Nl * C);
  flow.x = out_;
}

// out = inp @ W^T + b for a Linear whose input features are split over tp: the partial products are summed over
// tp (an all-reduce, or under sequence parallelism a reduce-scatter leaving this rank its rows of the sum), then
// the replicated bias is added once. Without tensor parallelism, linear_forward itself.
void Block::row_parallel_forward(const View1<float>& out, const View1<float>& inp, const Parameter& weight,
                                 const Parameter& bias, int N, int in, int OC) {
  if (!tp_->active()) return linear_forward<float>(out, inp, weight.value(), bias.value(), N, in, OC);
  const View1<float> partial = config_.sequence_parallel ? scratch_->gathered : out;
  linear_forward<float>(partial, inp, weight.value(), View1<float>(), N, in, OC);
  tp_->reduce_row_parallel(partial, out, N, OC);
  bias_forward<float>(out, bias.value(), static_cast<int>(config_.local_rows(N)), OC);
}

// flow.dx holds d(out) on entry and d(in) on exit, in the same buffer (see Gpt::backward).
void Block::backward(Flow& flow) {
  const int B = flow.B, T = flow.T, C = config_.n_embd, NH = config_.n_head, N = B * T;
  const int Cl = config_.local_width(), NHl = config_.local_heads(), Nl = static_cast<int>(config_.local_rows(N));
  const bool sp = config_.sequence_parallel;
  BlockScratch& s = scratch_for(B, T);
  const BlockActivations& a = acts_.get(*this, config_, B, T);
  const View1<float>& dout = flow.dx;
  if (sp) Kokkos::deep_copy(s.norm_grads, 0.0f);

  // MLP: out = res2 + c_proj(gelu(c_fc(ln_2(res2))))
  const View1<float> dout_rows = tp_->gather_rows(dout, s.gathered, N, C);  // (N,C): c_proj's output gradient
  Kokkos::deep_copy(s.dfch_gelu, 0.0f);
  linear_backward<float>(s.dfch_gelu, mlp_proj_weight.grad(), mlp_proj_bias.grad(), dout_rows, a.fch_gelu, mlp_proj_weight.value(), N, 4 * Cl, C);
  Kokkos::deep_copy(s.dfch, 0.0f);
  gelu_backward<float>(s.dfch, a.fch, s.dfch_gelu, N * 4 * Cl);
  Kokkos::deep_copy(s.dln, 0.0f);
  linear_backward<float>(s.dln, c_fc_weight.grad(), c_fc_bias.grad(), s.dfch, a.ln2, c_fc_weight.value(), N, C, 4 * Cl);
  const View1<float> dln2 = tp_->reduce_region_gradient(s.dln, s.dln_local, N, C);  // every rank's features fed ln_2
  const std::size_t local = static_cast<std::size_t>(Nl) * C;
  const View1<float> dres2 = sp ? tp_->own_block(s.dres2, local) : s.dres2;  // this rank's rows (all without sp)
  Kokkos::deep_copy(dres2, dout);  // the residual path
  layernorm_backward<float>(dres2, tp_->norm_gradient(ln_2_weight, s.norm_grads, 2),
                            tp_->norm_gradient(ln_2_bias, s.norm_grads, 3), dln2, a.res2, ln_2_weight.value(),
                            a.ln2_mean, a.ln2_rstd, Nl, C);

  // Attention: res2 = in + c_proj(attn(c_attn(ln_1(in))))
  if (sp) tp_->all_gather(s.dres2, local);  // c_proj's output gradient, every row
  Kokkos::deep_copy(s.datty, 0.0f);
  linear_backward<float>(s.datty, attn_proj_weight.grad(), attn_proj_bias.grad(), s.dres2, a.atty, attn_proj_weight.value(), N, Cl, C);
  Kokkos::deep_copy(s.dqkv, 0.0f);
  attention_backward_as(config_.attention, s.dqkv, s.datt, s.datty, a.qkv, a.atty, a.att, s.attention_workspace,
                        AttentionShape{B, T, NHl, NHl, C / NH});
  Kokkos::deep_copy(s.dln, 0.0f);
  linear_backward<float>(s.dln, c_attn_weight.grad(), c_attn_bias.grad(), s.dqkv, a.ln1, c_attn_weight.value(), N, C, 3 * Cl);
  const View1<float> dln1 = tp_->reduce_region_gradient(s.dln, s.dln_local, N, C);
  Kokkos::deep_copy(dout, dres2);  // the residual path, into the caller's buffer: d(out) is no longer needed
  layernorm_backward<float>(dout, tp_->norm_gradient(ln_1_weight, s.norm_grads, 0),
                            tp_->norm_gradient(ln_1_bias, s.norm_grads, 1), dln1, in_, ln_1_weight.value(),
                            a.ln1_mean, a.ln1_rstd, Nl, C);
  // The norms saw this rank's rows only: their gradients summed over tp, then added.
  if (sp) tp_->add_norm_gradients(s.norm_grads, {ln_1_weight.grad(), ln_1_bias.grad(), ln_2_weight.grad(), ln_2_bias.grad()});
}

// ---------------------------------------------------------------------------------------------------------
// Gpt: tokens -> wte + wpe -> blocks -> ln_f -> logits = x wte^T (or lm_head) -> cross-entropy

Gpt::Gpt(const GptConfig& c)
    : LanguageModel("GPT"),
      wte(add_parameter("wte.weight", {c.vocab_size, c.n_embd}, InitRule::normal(kStd), ParamRole::embedding)),
      wpe(add_parameter("wpe.weight", {c.context_length, c.n_embd}, InitRule::normal(kStd), ParamRole::embedding)),
      ln_f_weight(add_parameter("ln_f.weight", {c.n_embd}, InitRule::ones(), ParamRole::norm)),
      ln_f_bias(add_parameter("ln_f.bias", {c.n_embd}, InitRule::zeros(), ParamRole::bias)),
      lm_head(c.tie_embeddings ? nullptr
                               : &add_parameter("lm_head.weight", {c.vocab_size, c.n_embd}, InitRule::normal(kStd),
                                                ParamRole::weight)),
      config_(c),
      scratch_(std::make_shared<BlockScratch>()),
      recomputed_(std::make_shared<BlockActivations>()),
      tp_(std::make_shared<TensorParallelGroup>()) {
  c.validate();
  for (int l = 0; l < c.n_layer; ++l) {
    blocks_.push_back(std::make_unique<Block>(c, scratch_, recomputed_));
    add_child(*blocks_.back(), "h." + std::to_string(l));
  }
}

void Gpt::apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) {
  const GptConfig& c = config_;
  const int k = tp->ranks();
  FSDPP_REQUIRE(c.n_head % k == 0, "mesh.tp ({}) must divide model.n_head ({}): each tensor-parallel rank computes "
                "whole attention heads", k, c.n_head);
  tp->require_vocabulary_rows(c.vocab_size);
  tp_ = std::move(tp);
  config_.tp = k;
  config_.sequence_parallel = tp_->sequence_parallel();
  wte.set_tensor_parallel(tp_->shard(0));  // the vocabulary: embedding rows and logits columns
  if (lm_head) lm_head->set_tensor_parallel(tp_->shard(0));
  for (auto& block : blocks_) block->apply_tensor_parallel(tp_);
}

std::vector<Block*> Gpt::blocks() const {
  std::vector<Block*> out;
  for (const auto& b : blocks_) out.push_back(b.get());
  return out;
}

std::vector<Module*> Gpt::block_modules() const {
  std::vector<Module*> out;
  for (const auto& b : blocks_) out.push_back(b.get());
  return out;
}

std::string Gpt::describe() const {
  const GptConfig& c = config_;
  return fmt::format("GPT-2, V {} T {} C {} L {} NH {} ({} embeddings)", c.vocab_size, c.context_length, c.n_embd,
                     c.n_layer, c.n_head, c.tie_embeddings ? "tied" : "untied");
}

std::int64_t Gpt::activation_bytes() const {
  std::int64_t total = bytes_of({&x0_, &lnf_, &lnf_mean_, &lnf_rstd_, &logits_, &losses_, &dlnf_, &dx_, &ce_stats_,
                                 &dlnf_local_, &norm_grads_});
  total += static_cast<std::int64_t>(local_tokens_.extent(0)) * 4;
  for (const auto& b : blocks_) total += b->activation_bytes();
  total += recomputed_->bytes();
  const BlockScratch& s = *scratch_;
  return total + bytes_of({&s.dres2, &s.dln, &s.dqkv, &s.datty, &s.datt, &s.dfch, &s.dfch_gelu, &s.attention_workspace,
                           &s.gathered, &s.dln_local, &s.norm_grads});
}

std::int64_t Gpt::activation_bytes_for(const GptConfig& c, int B, int T, int recomputing_blocks) {
  const std::int64_t N = std::int64_t{B} * T, C = c.n_embd, V = c.local_vocab(), Cl = c.local_width();
  const std::int64_t Nl = c.local_rows(N);  // the residual stream's rows here: N unless sequence parallel
  const std::int64_t attention = std::int64_t{B} * c.local_heads() * T * attention_row_floats(c.attention, T);
  const std::int64_t outputs = 4 * c.n_layer * Nl * C;                  // Block::ensure_output, every block
  const std::int64_t recomputable = BlockActivations::bytes_for(c, B, T);  // per block that keeps its own...
  const std::int64_t sets = c.n_layer - recomputing_blocks + (recomputing_blocks > 0 ? 1 : 0);  // ...+ one shared
  const std::int64_t vocab_parallel = c.tp > 1 ? 4 * (N + 3 * N) : 0;     // local tokens, cross-entropy statistics
  // Gpt::ensure_activations: x0, dx and the final norm's statistics (Nl rows); lnf, dlnf (N,C); logits, losses
  const std::int64_t sequence_parallel = c.sequence_parallel ? 4 * (Nl * C + 2 * C) : 0;  // dlnf_local, norm_grads
  const std::int64_t head = 4 * (2 * Nl * C + 2 * N * C + 2 * Nl + N + N * V) + vocab_parallel + sequence_parallel;
  const std::int64_t workspace = attention_workspace_floats(c.attention, B, T, 3 * Cl, Cl);
  const std::int64_t block_sp = c.sequence_parallel ? N * C + Nl * C + 4 * C : 0;  // gathered, dln_local, norm_grads
  const std::int64_t scratch = 4 * (2 * N * C + 12 * N * Cl + attention + workspace + block_sp);  // BlockScratch::ensure
  return outputs + sets * recomputable + head + scratch;
}

void Gpt::ensure_activations(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  const std::size_t N = static_cast<std::size_t>(B) * T, C = config_.n_embd;
  const std::size_t Nl = static_cast<std::size_t>(config_.local_rows(static_cast<std::int64_t>(N)));
  x0_ = uninitialized<float>("gpt.x0", Nl * C);
  lnf_ = uninitialized<float>("gpt.lnf", N * C);
  lnf_mean_ = uninitialized<float>("gpt.lnf_mean", Nl);
  lnf_rstd_ = uninitialized<float>("gpt.lnf_rstd", Nl);
  logits_ = uninitialized<float>("gpt.logits", N * static_cast<std::size_t>(head().rows()));  // this rank's vocabulary
  losses_ = uninitialized<float>("gpt.losses", N);
  dlnf_ = uninitialized<float>("gpt.dlnf", N * C);
  dx_ = uninitialized<float>("gpt.dx", Nl * C);
  if (config_.sequence_parallel) {
    dlnf_local_ = uninitialized<float>("gpt.dlnf_local", Nl * C);
    norm_grads_ = uninitialized<float>("gpt.norm_grads", 2 * C);
  }
  if (tp_->active()) {
    local_tokens_ = View1<std::int32_t>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gpt.local_tokens"), N);
    ce_stats_ = uninitialized<float>("gpt.ce_stats", 3 * N);
  }
}

void Gpt::forward(Flow& flow) {
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
    // Every rank's vocabulary rows contribute to each token's embedding: the (N,C) partial sums are all-reduced,
    // or reduce-scattered to this rank's rows (lnf_ serves as their buffer: it is free until the final norm).
    localize_tokens(local_tokens_, flow.tokens, tp_->vocab_offset(config_.vocab_size), N);
    const View1<float> partial = sp ? lnf_ : x0_;
    vocab_parallel_embedding_forward<float>(partial, local_tokens_, wte.value(), wpe.value(), tp_->rank() == 0, B, T, C);
    tp_->reduce_row_parallel(partial, x0_, N, C);
  } else {
    encoder_forward<float>(x0_, flow.tokens, wte.value(), wpe.value(), B, T, C);
  }
  flow.x = x0_;
  for (auto& block : blocks_) (*block)(flow);
  final_x_ = flow.x;
  layernorm_forward<float>(sp ? tp_->own_block(lnf_, local) : lnf_, lnf_mean_, lnf_rstd_, final_x_, ln_f_weight.value(),
                           ln_f_bias.value(), Nl, C);
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

void Gpt::backward(Flow& flow) {
  const int B = flow.B, T = flow.T, C = config_.n_embd, N = B * T;
  FSDPP_CHECK(flow.training, "backward after a forward with training = false: the loss gradient was not prepared");
  const int Vl = static_cast<int>(head().rows());
  const bool sp = config_.sequence_parallel;
  const int Nl = static_cast<int>(config_.local_rows(N));
  Kokkos::deep_copy(dlnf_, 0.0f);
  linear_backward<float>(dlnf_, head().grad(), View1<float>(), logits_, lnf_, head().value(), N, C, Vl);
  // Every rank's vocabulary columns contributed to d(lnf): summed, or under sp reduce-scattered to this rank's rows.
  const View1<float> dlnf = tp_->reduce_region_gradient(dlnf_, dlnf_local_, N, C);
  Kokkos::deep_copy(dx_, 0.0f);
  if (sp) Kokkos::deep_copy(norm_grads_, 0.0f);
  layernorm_backward<float>(dx_, tp_->norm_gradient(ln_f_weight, norm_grads_, 0),
                            tp_->norm_gradient(ln_f_bias, norm_grads_, 1),
                            dlnf, final_x_, ln_f_weight.value(), lnf_mean_, lnf_rstd_, Nl, C);
  if (sp) tp_->add_norm_gradients(norm_grads_, {ln_f_weight.grad(), ln_f_bias.grad()});  // each rank saw its rows
  flow.dx = dx_;
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) (**it)(flow, Pass::backward);
  // The embedding's gradient needs every row: under sp, gathered into dlnf_ (free again).
  const View1<float> dx = tp_->gather_rows(flow.dx, dlnf_, N, C);
  // Under tp, tokens another rank holds fall outside this rank's rows of wte and are skipped; every rank adds
  // the whole dwpe (wpe is replicated, its gradient the same on every tp rank).
  encoder_backward<float>(wte.grad(), wpe.grad(), dx,
                          tp_->active() ? View1<const std::int32_t>(local_tokens_) : flow.tokens, B, T, C);
}

}  // namespace fsdpp
