#include "fsdpp/nn/causal_lm.hpp"

#include "fsdpp/nn/weight_gradient_stash.hpp"

#include "fsdpp/config/deck_rules.hpp"

#include "fsdpp/nn/expert_parallel.hpp"
#include "fsdpp/nn/kernels/crossentropy.hpp"
#include "fsdpp/nn/kernels/decode.hpp"
#include "fsdpp/nn/kernels/document.hpp"
#include "fsdpp/nn/kernels/embedding.hpp"
#include "fsdpp/nn/kernels/encoder.hpp"
#include "fsdpp/nn/kernels/linear.hpp"
#include "fsdpp/nn/kernels/vocab_parallel.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/exact_words.hpp"

#include <algorithm>

namespace fsdpp {

using namespace kernels;

CausalLM::CausalLM(const ModelConfig& c, LmLayout layout, const BlockDims& dims)
    : LanguageModel(layout.type_name),
      token_embedding(add_parameter(layout.embedding, {c.vocab_size, c.n_embd}, InitRule::normal(kInitStd),
                                    ParamRole::embedding)),
      position_table(layout.position_table.empty()
                         ? nullptr
                         : &add_parameter(layout.position_table, {c.context_length, c.n_embd}, InitRule::normal(kInitStd),
                                          ParamRole::embedding)),
      final_norm(*this, layout.final_norm, layout.norm, c.n_embd, c.norm_eps),
      lm_head(c.tie_embeddings ? nullptr
                               : &add_parameter("lm_head.weight", {c.vocab_size, c.n_embd}, InitRule::normal(kInitStd),
                                                ParamRole::weight)),
      config_(c),
      layout_(std::move(layout)),
      dims_(dims),
      context_(std::make_shared<BlockContext>()) {
  context_->attention = c.attention;
  RotaryTables& rope = context_->rotary;
  rope.enabled = layout_.position_table.empty();
  rope.context_length = c.context_length;
  rope.head_size = dims.head_size;
  rope.theta = c.rope_theta;
  rope.scaling = {c.rope_scaling_factor, c.rope_low_freq_factor, c.rope_high_freq_factor,
                  static_cast<double>(c.rope_original_context)};
}

void CausalLM::require_shape(const ModelConfig& c, ModelArch arch) {
  FSDPP_REQUIRE(c.arch == arch, "a {} model built from a model.arch {} deck", to_string(arch), to_string(c.arch));
  check_model_shape(c);  // the deck's rules, written once in config/deck_rules.cpp
}

void CausalLM::number_sparse_blocks() {
  int sparse = 0;
  bool dense = false;
  for (auto& block : blocks_) {
    if (block->moe()) block->sparse_index_ = sparse++;
    else dense = true;
  }
  context_->dense_mlp = dense;
  if (sparse > 0) context_->router = std::make_shared<RouterStatistics>(config_.moe, sparse);
}

std::vector<Module*> CausalLM::block_modules() const {
  std::vector<Module*> out;
  for (const auto& b : blocks_) out.push_back(b.get());
  return out;
}

void CausalLM::set_document_masks(const DocumentMasks& masks) {
  FSDPP_REQUIRE(!masks.reset_positions || context_->rotary.enabled,
                "data.reset_positions: {} has a learned position table, which fsdpp does not reset (rotary "
                "positions only: llama, qwen2)", layout_.type_name);
  FSDPP_REQUIRE(masks.eot_id < config_.vocab_size, "data.eot_id ({}) must be below model.vocab_size ({})",
                masks.eot_id, config_.vocab_size);
  masks_ = masks;
  if (context_->cp->active()) context_->cp->configure(context_->cp->kv_width(), masks_.enabled());
}

void CausalLM::apply_context_parallel(std::shared_ptr<ContextParallelGroup> cp) {
  context_->cp = std::move(cp);
  if (!context_->cp->active()) return;
  context_->attention = AttentionKind::fused;  // the ring's blocks are the fused kernels' (deck rule: not reference)
  const DecoderBlock::Local l = blocks_.front()->local();  // after tensor parallelism: this rank's KV heads
  context_->cp->configure(2 * l.kv_heads * l.head_size, masks_.enabled());
  FSDPP_CHECK(context_->cp->kv_width() == ContextParallelGroup::kv_width_of(config_, context_->tp->ranks()),
              "context parallelism: the blocks' key/value width {} is not the planner's", context_->cp->kv_width());
}

void CausalLM::apply_reproducible_chunks(int rows) {
  context_->chunks.configure(rows, chunk_scratch_elements());
  if (rows == 0 || !context_->cp->active()) return;
  const DecoderBlock::Local l = blocks_.front()->local();
  context_->cp->set_fixed_order(l.heads * l.head_size, l.heads);
}

void CausalLM::keep_pipeline_stage(const PipelineStagePart& part) {
  const int L = config_.n_layer;
  FSDPP_CHECK(static_cast<int>(blocks_.size()) == L && part.count() >= 1, "pipeline stage of a {}-block model cut before",
              L);
  PipelineStagePart kept_part = part;
  for (std::size_t c = 0; c < kept_part.chunks.size(); ++c) {
    BlockRange& r = kept_part.chunks[c];
    if (r.end < 0) r.end = L;
    const int previous_end = c == 0 ? 0 : kept_part.chunks[c - 1].end;
    FSDPP_CHECK(previous_end <= r.first && r.first < r.end && r.end <= L,
                "pipeline chunk {} of blocks [{}, {}) of a {}-block model: chunks are ascending runs of blocks", c,
                r.first, r.end, L);
  }
  std::vector<std::unique_ptr<DecoderBlock>> kept;
  chunk_begin_.assign(1, 0);
  for (const BlockRange& r : kept_part.chunks) {
    for (auto& block : blocks_)
      if (block && block->index_ >= r.first && block->index_ < r.end) kept.push_back(std::move(block));
    chunk_begin_.push_back(kept.size());
  }
  for (auto& block : blocks_)
    if (block) remove_child(*block);  // destroyed with `blocks_` below, its parameters with it
  blocks_ = std::move(kept);
  // The embedding serves the head too when tied: the last stage keeps it then, and its gradient is summed with the
  // first stage's (parallel/pipeline_parallel.hpp).
  const bool embedding_rows = part.embedding || (part.head && !lm_head);
  if (!embedding_rows) drop_parameter(token_embedding);
  if (!part.embedding && position_table) drop_parameter(*position_table);
  if (!part.head) {
    for (const Parameter* p : final_norm.parameters()) drop_parameter(*p);
    if (lm_head) drop_parameter(*lm_head);
  }
  stage_ = kept_part;
  chunk_ = 0;
}

std::pair<std::size_t, std::size_t> CausalLM::chunk_blocks() const {
  if (chunk_begin_.empty()) return {0, blocks_.size()};  // the whole model
  return {chunk_begin_[sz(chunk_)], chunk_begin_[sz(chunk_) + 1]};
}

bool CausalLM::runs_child(const Module& child) const {
  const auto [begin, end] = chunk_blocks();
  for (std::size_t b = 0; b < blocks_.size(); ++b)
    if (blocks_[b].get() == &child) return b >= begin && b < end;
  return true;  // not a block
}

void CausalLM::swap_activation_slot(int from, int to) {
  SlotState current{std::move(head_), std::move(head_buffers_), final_x_};
  slots_.swap(current, from, to);
  head_ = std::move(current.head);
  head_buffers_ = std::move(current.buffers);
  final_x_ = current.final_x;
  // The blocks read the slot's document starts (under cp its local rows', which backward takes: use_local_rows).
  if (masks_.enabled() && !context_->cp->active()) context_->document_starts = head_.document_starts;
}

std::size_t CausalLM::residual_elements(int B, int T) const {
  const int local_T = context_->cp->active() ? context_->cp->local_length(T) : T;
  return sz(std::int64_t{context_->tp->local_rows(B * local_T)} * config_.n_embd);
}

std::int64_t CausalLM::parameter_count() const {
  std::int64_t total = 0;
  for (const Parameter* p : parameters()) total += p->global_numel();
  return total;
}

// PaLM's convention (appendix B), as nanoGPT estimates MFU: 6 x every parameter that multiplies an activation
// (forward 2, backward 4 per weight: the projections, the head, biases and norm weights) — all but the lookup
// tables (the position table, and the token embedding when the head has its own weight) — plus 12 x L x T x C for
// the attention score and value products (forward 4 L T C, backward twice that), without the causal saving.
// A sparse block's experts multiply only top_k of every E of their weights per token: the active parameters count,
// as MoE papers quote MFU. The attention term uses the heads' width NH hs (C unless model.head_dim sets it).
LanguageModel::FlopsByPiece CausalLM::flops_per_token_by_piece(int T) const {
  auto numel = [](const auto& params) {
    double n = 0;
    for (const Parameter* p : params) n += static_cast<double>(p->global_numel());
    return n;
  };
  FlopsByPiece f;
  // Before the blocks: lookups only (the position table; the token embedding too when the head has its own).
  // After them: the final norm and the head's weight (the token embedding when tied).
  f.after = 6.0 * (numel(final_norm.parameters()) + static_cast<double>(head().global_numel()));
  for (const auto& block : blocks_) {
    double multiplying = numel(static_cast<const Module&>(*block).parameters());
    if (const MoeFeedForward* moe = block->moe()) {
      const double experts = static_cast<double>(moe->experts.gate.global_numel() + moe->experts.up.global_numel() +
                                                 moe->experts.down.global_numel());
      multiplying -= experts * (1.0 - static_cast<double>(moe->top_k()) / moe->num_experts());
    }
    f.blocks.push_back(6.0 * multiplying + 12.0 * static_cast<double>(T) * dims_.heads * dims_.head_size);
  }
  return f;
}

void CausalLM::apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) {
  const int k = tp->ranks();
  check_tensor_parallel(config_, k, tp->sequence_parallel());  // heads, MLP width and vocabulary rows split whole over the tp ranks
  context_->tp = std::move(tp);
  const TensorParallelGroup& group = *context_->tp;
  token_embedding.set_tensor_parallel(group.shard(0));  // the vocabulary: embedding rows and logits columns
  if (lm_head) lm_head->set_tensor_parallel(group.shard(0));
  for (auto& block : blocks_) block->apply_tensor_parallel(group);
}

void CausalLM::balance_expert_load(const std::vector<double>& tokens) {
  const std::size_t E = sz(config_.moe.num_experts);
  for (auto& block : blocks_)  // a pipeline stage's blocks: their rows of the whole model's (sparse layers, E)
    if (MoeFeedForward* moe = block->moe()) {
      const std::size_t layer = sz(block->sparse_index());
      FSDPP_CHECK(tokens.size() >= (layer + 1) * E, "balance_expert_load: {} counts for {} experts x more layers",
                  tokens.size(), E);
      moe->balance_load(tokens.data() + layer * E, config_.moe.bias_update_rate);
    }
}

std::vector<Module*> CausalLM::apply_expert_parallel(std::shared_ptr<ExpertParallelGroup> ep, bool per_source) {
  context_->ep = std::move(ep);
  std::vector<Module*> experts;
  for (auto& block : blocks_)
    if (MoeFeedForward* moe = block->moe()) {
      moe->use_expert_parallel(*context_->ep, block->display_name() + " experts", per_source);
      experts.push_back(&moe->experts);
    }
  // None on a pipeline stage of dense blocks only (DeepSeek-V3's first layers are dense): it has nothing to
  // exchange. A mixture-of-experts model without sparse layers is refused with the deck (check_moe).
  return experts;
}

// ---------------------------------------------------------------------------------------------------------
// Buffers: the head's table, and the whole model's bytes from the tables

BufferTable CausalLM::head_table(Head& h, int B, int T, int chunk) const {
  const TensorParallelGroup& tp = *context_->tp;
  const std::int64_t N = std::int64_t{B} * T, C = config_.n_embd, Nl = tp.local_rows(static_cast<int>(N));
  // A pipeline rank holds the buffers of the chunk it runs: each chunk has activation slots of its own.
  const bool embeds = stage_.embeds(chunk), heads = stage_.heads(chunk);
  BufferTable t;
  if (embeds) t.add("x0", sz(Nl * C), h.x0);  // the embedding's output, the first block's input
  // The final norm's output, gathered: the head's input (and the embedding's partial sums under sp).
  if (heads || (embeds && tp.sequence_parallel())) t.add("lnf", sz(N * C), h.lnf);
  if (heads) {
    const std::int64_t Vl = head().rows();  // this rank's vocabulary rows (V without tensor parallelism)
    final_norm.add_stats(t, "lnf", sz(Nl), h.lnf_stats);
    t.add("logits", sz(N * Vl), h.logits);  // holds d(loss)/d(logits) after a training forward
    t.add("losses", sz(N), h.losses);
  }
  // d(lnf); the embedding's backward gathers every row's gradient there under sp.
  if (heads || (embeds && tp.sequence_parallel())) t.add("dlnf", sz(N * C), h.dlnf);
  if (heads) {
    t.add("dx", sz(Nl * C), h.dx);    // the gradient of the residual stream
    if (tp.sequence_parallel()) {
      t.add("dlnf_local", sz(Nl * C), h.dlnf_local);
      t.add("norm_grads", final_norm.parameters().size() * sz(C), h.norm_grads);  // before their sum over tp
    }
  }
  if (tp.active() && (embeds || heads)) {
    t.add("local_tokens", sz(N), h.local_tokens);  // tokens - v0: this rank's rows of the embedding
    if (heads) t.add("ce_stats", sz(3 * N), h.ce_stats);  // the cross-entropy's row max, sum of exp, target logit
  }
  if (masks_.enabled() && !context_->cp->active())  // under cp the group finds them (context_parallel.hpp)
    t.add("document_starts", sz(N), h.document_starts);  // kernels/document.hpp; every row
  if (context_->cp->active()) context_->cp->add_rows(t, h.cp_rows, B, T);  // T: the local rows
  return t;
}

std::int64_t CausalLM::activation_bytes() const {
  std::int64_t total = head_buffers_.bytes() + context_->scratch.buffers.bytes() + context_->recomputed.bytes() +
                       context_->rotary.buffers.bytes() + context_->moe_scratch.buffers.bytes() +
                       context_->recomputed_moe.bytes() + (context_->ep ? context_->ep->buffer_bytes() : 0) +
                       context_->cp->buffer_bytes() + chunk_scratch_bytes();
  for (const auto& b : blocks_) total += b->activation_bytes();
  return total;
}

// From the same tables, for a shape not run yet: every block's output, one activation set per block that keeps
// its own plus one shared by the `recomputing_blocks`, the shared scratch, the head's buffers and RoPE's tables.
// Sparse blocks add their routed rows' sets the same way (one shared by those that recompute), the experts'
// scratch once, and under expert parallelism the exchange's staging buffer. Which blocks recompute: the blocks'
// own flags when they are `recomputing_blocks` many (a model parallelize has set), else the first
// `recomputing_blocks` (the same count for a model of one kind of block). A block's output and own sets, and the
// head's buffers, are its chunk's per micro-batch in flight (activation slots); the rest is shared.
LanguageModel::ActivationSplit CausalLM::activation_split(int B, int T_sequence, int recomputing_blocks) const {
  // Under context parallelism the blocks and the head hold T/cp rows, and the ring its buffers.
  ContextParallelGroup& cp = *context_->cp;
  const int T = cp.active() ? cp.local_length(T_sequence) : T_sequence;
  const DecoderBlock& block = *blocks_.front();
  BlockActivations acts;
  BlockScratch scratch;
  RotaryTables rotary = context_->rotary;
  const std::int64_t set = block.activation_table(acts, B, T).bytes();
  ActivationSplit out;
  out.shared = block.scratch_table(scratch, B, T).bytes() + rotary.table().bytes() +
               (cp.active() ? cp.buffer_table(B, T).bytes() : 0) + chunk_scratch_bytes() +
               (recomputing_blocks > 0 ? set : 0) + (context_->ep ? context_->ep->buffer_bytes() : 0);
  const bool use_flags = recomputing_blocks == recomputing_blocks_now();
  bool shared_moe = false, any_moe = false;
  const int N = B * T;
  for (int c = 0; c < stage_.count(); ++c) {
    Head head;
    std::int64_t slot = head_table(head, B, T, c).bytes();
    const std::size_t begin = chunk_begin_.empty() ? 0 : chunk_begin_[sz(c)];
    const std::size_t end = chunk_begin_.empty() ? blocks_.size() : chunk_begin_[sz(c) + 1];
    for (std::size_t l = begin; l < end; ++l) {
      const bool recomputes = use_flags ? blocks_[l]->recomputes_in_backward() : static_cast<int>(l) < recomputing_blocks;
      slot += block.output_bytes(B, T) + (recomputes ? 0 : set);
      const MoeFeedForward* moe = blocks_[l]->moe();
      if (!moe) continue;
      MoeActivations moe_acts;
      const std::int64_t moe_set = moe->activation_table(moe_acts, N).bytes();
      if (!recomputes) slot += moe_set;
      if (recomputes && !shared_moe) out.shared += moe_set, shared_moe = true;
      if (!any_moe) {
        MoeScratch moe_scratch;
        out.shared += moe->scratch_table(moe_scratch, N).bytes();
        any_moe = true;
      }
    }
    out.per_slot.push_back(slot);
  }
  return out;
}

// The gradient chunks' scratch: the largest gradient, and beside it the largest that is cut second (a bias, a
// norm's weight or bias, Qwen3's k norm, GPT-2's position table).
std::array<std::int64_t, 2> CausalLM::chunk_scratch_elements() const {
  std::array<std::int64_t, 2> n = {0, 0};
  for (const Parameter* p : parameters()) {
    n[0] = std::max(n[0], p->numel());
    if (p->role() == ParamRole::bias || p->role() == ParamRole::norm || p == position_table)
      n[1] = std::max(n[1], p->numel());
  }
  return n;
}

std::int64_t CausalLM::chunk_scratch_bytes() const {
  if (!context_->chunks.active()) return 0;
  const auto n = chunk_scratch_elements();
  return (n[0] + n[1]) * static_cast<std::int64_t>(sizeof(float));
}

int CausalLM::recomputing_blocks_now() const {
  int n = 0;
  for (const auto& b : blocks_) n += b->recomputes_in_backward() ? 1 : 0;
  return n;
}

// ---------------------------------------------------------------------------------------------------------
// Forward and backward, side by side

// x0 = E[tokens] (+ P[t]). Under tensor parallelism every rank's vocabulary rows contribute to each token's
// embedding (tokens another rank holds get zero rows here): the (N,C) partial sums are all-reduced, or
// reduce-scattered to this rank's rows (lnf serves as their buffer then: it is free until the final norm).
void CausalLM::embed(const Flow& flow, int N) {
  TensorParallelGroup& tp = *context_->tp;
  const int B = flow.B, T = flow.T, C = config_.n_embd;
  const View1<float> wpe = position_table ? position_table->value() : View1<float>();
  if (!tp.active()) {
    if (position_table)
      return encoder_forward<float>(head_.x0, flow.tokens, token_embedding.value(), wpe, B, T, C,
                                    context_->rope_positions());
    return embedding_forward<float>(head_.x0, flow.tokens, token_embedding.value(), N, C);
  }
  localize_tokens(head_.local_tokens, flow.tokens, tp.vocab_offset(config_.vocab_size), N);
  const View1<float> partial = tp.sequence_parallel() ? head_.lnf : head_.x0;
  if (position_table)  // one tp rank adds the positions, so that the sum holds them once
    vocab_parallel_embedding_forward<float>(partial, head_.local_tokens, token_embedding.value(), wpe, tp.rank() == 0,
                                            B, T, C, context_->rope_positions());
  else
    embedding_forward<float>(partial, head_.local_tokens, token_embedding.value(), N, C);
  tp.reduce_row_parallel(partial, head_.x0, N, C);
}

// The embedding's gradient needs every row (under sequence parallelism gathered into dlnf, free again); tokens
// another rank holds fall outside this rank's rows and are skipped. Every tp rank adds the whole position table's
// gradient (the table is replicated, its gradient the same on every tp rank).
void CausalLM::embed_backward(const Flow& flow, const View1<float>& dx_local, int N) {
  TensorParallelGroup& tp = *context_->tp;
  const int C = config_.n_embd;
  const View1<float> dx = tp.gather_rows(dx_local, head_.dlnf, N, C);
  const View1<const std::int32_t> tokens = tp.active() ? View1<const std::int32_t>(head_.local_tokens) : flow.tokens;
  GradientChunks& chunks = context_->chunks;
  chunks.sum(&token_embedding, position_table, N, [&](const View1<float>& dwte, const View1<float>& dwpe, int row0,
                                                      int rows) {
    const View1<float> x = chunk_rows(dx, row0, rows, C);
    const View1<const std::int32_t> ids = chunk_rows(tokens, row0, rows);
    const std::int32_t* positions = context_->rope_positions();
    if (!position_table) return embedding_backward<float>(dwte, x, ids, rows, C);
    if (!chunks.active())
      return encoder_backward<float>(dwte, dwpe, dx, tokens, flow.B, flow.T, C, positions);
    // One chunk of one sequence: its rows sit at positions[row0...] (cp), or at row0 mod T onwards.
    if (positions) return encoder_backward<float>(dwte, dwpe, x, ids, 1, rows, C, positions + row0);
    encoder_backward<float>(dwte, chunk_rows(dwpe, row0 % flow.T, rows, C), x, ids, 1, rows, C);
  });
}

// Context parallelism: the flow's whole sequences become this rank's chunks of them (tokens, targets, T / cp), with
// their global positions for RoPE and, under document masks, their documents' starts found over the whole rows.
// They are kept with the micro-batch's activations (head_), for its backward.
void CausalLM::localize_sequences(Flow& flow) {
  context_->cp->localize(head_.cp_rows, flow.tokens, flow.targets, flow.B, flow.T,
                         masks_.enabled() ? masks_.eot_id : -1);
  use_local_rows(flow);
}

void CausalLM::use_local_rows(Flow& flow) {
  const ContextParallelGroup::LocalRows& rows = head_.cp_rows;
  flow.T = static_cast<int>(rows.tokens.extent(0)) / flow.B;
  flow.tokens = rows.tokens;
  flow.targets = rows.targets;
  attend_on_local_rows();
}

void CausalLM::attend_on_local_rows() {
  context_->positions = head_.cp_rows.positions;
  context_->document_starts = head_.cp_rows.starts;
  context_->reset_positions = masks_.reset_positions;
  context_->cp->use_rows(head_.cp_rows);
}

void CausalLM::forward(Flow& flow) {
  if (flow.decode) return decode_forward(flow);
  FSDPP_REQUIRE(flow.T >= 1 && flow.T <= config_.context_length, "sequence length {} exceeds model.context_length {}",
                flow.T, config_.context_length);
  ContextParallelGroup& cp = *context_->cp;
  // Under context parallelism this rank's T/cp rows of each sequence, from localize_sequences on.
  const int B = flow.B, T = cp.active() ? cp.local_length(flow.T) : flow.T;
  const int C = config_.n_embd, V = config_.vocab_size, N = B * T;
  head_buffers_.ensure("lm", B, T, [&] { return head_table(head_, B, T, chunk_); });
  if (cp.active()) localize_sequences(flow);
  TensorParallelGroup& tp = *context_->tp;
  const bool sp = tp.sequence_parallel();
  if (sp) check_sequence_parallel_tokens(B, T, tp.ranks());
  const int Nl = tp.local_rows(N);
  if (masks_.enabled() && !context_->cp->active()) {  // the blocks read them, in forward, a recomputation, backward
    document_starts(head_.document_starts, flow.tokens, B, T, masks_.eot_id);
    context_->document_starts = head_.document_starts;
    context_->reset_positions = masks_.reset_positions;
  }
  if (stage_.embeds(chunk_)) {
    embed(flow, N);
    flow.x = head_.x0;
  }  // else a later pipeline stage: the previous stage's output is in flow.x
  RouterStatistics* router = flow.training ? context_->router.get() : nullptr;
  // A later pipeline stage records on from what the stages before it recorded (restored by pipeline_step.cpp).
  if (router && stage_.embeds(chunk_)) router->begin();
  context_->recording = router;
  const auto [begin, end] = chunk_blocks();
  for (std::size_t b = begin; b < end; ++b) (*blocks_[b])(flow);
  context_->recording = nullptr;
  if (!stage_.heads(chunk_)) return;  // a pipeline stage before the last: its output leaves in flow.x
  final_x_ = flow.x;
  const std::size_t local = sz(std::int64_t{Nl} * C);
  final_norm.forward(sp ? tp.own_block(head_.lnf, local) : head_.lnf, head_.lnf_stats, final_x_, Nl, C);
  if (sp) tp.all_gather(head_.lnf, local);  // the head reads every row
  const int Vl = static_cast<int>(head().rows());  // V without tensor parallelism
  linear_forward<float>(head_.logits, head_.lnf, head().value(), View1<float>(), N, C, Vl);
  // Training: the fused kernel leaves d(loss)/d(logits) in the logits, saving a (N,V) buffer.
  // d(objective)/d(loss) of a row: the loss is a mean over this rank's rows, or, under reproducible chunks with cp,
  // over the whole sequences' (the exact sum adds the cp ranks' parts, where fully_shard would average them).
  const float dloss = flow.loss_scale / static_cast<float>(context_->chunks.active() ? N * context_->cp->ranks() : N);
  if (tp.active())
    tp.vocab_parallel_loss(head_.logits, head_.losses, head_.ce_stats, flow.targets, N, Vl, V, dloss, flow.training);
  else if (flow.training)
    crossentropy_forward_backward<float>(head_.logits, head_.losses, flow.targets, N, V, dloss);
  else
    crossentropy_forward<float>(head_.losses, head_.logits, flow.targets, N, V);
  flow.loss = mean_loss(head_.losses, N);
  if (router) {  // every layer has routed: the balancing losses over them all, before any backward reads them
    finish_router_statistics(flow.loss_scale);
    flow.loss += router->weighted_loss();
  }
}

void CausalLM::finish_router_statistics(float loss_scale) {
  if (context_->router) context_->router->finish(loss_scale, context_->cp->active() ? context_->cp.get() : nullptr);
}

std::size_t CausalLM::pipeline_payload_size() const { return context_->router ? context_->router->state_size() : 0; }

void CausalLM::write_pipeline_payload(std::vector<double>& out) const {
  if (context_->router) context_->router->state(out);
  else out.clear();
}

void CausalLM::read_forward_payload(const std::vector<double>& in) {
  // A later stage records on from what the stages before it recorded (forward begins them on the first only).
  if (context_->router) context_->router->restore(in);
}

void CausalLM::read_backward_payload(const std::vector<double>& in, float loss_scale) {
  if (!context_->router) return;
  // The whole forward's statistics: this stage's layers' gradients of the balancing losses.
  context_->router->restore(in);
  finish_router_statistics(loss_scale);
}

void CausalLM::add_routing_totals(RoutingTotals& totals) const {
  const RouterStatistics* router = context_->router.get();
  if (!router) return;
  totals.aux += router->aux_loss();
  totals.dropped += static_cast<double>(router->dropped());
  totals.selections.resize(router->selections().size());
  for (std::size_t i = 0; i < totals.selections.size(); ++i)
    totals.selections[i] += static_cast<double>(router->selections()[i]);
}

void CausalLM::backward(Flow& flow) {
  // The rows its forward localized: a pipeline's backward comes with the whole sequences loaded again.
  if (context_->cp->active()) use_local_rows(flow);
  const int N = flow.B * flow.T, Nl = context_->tp->local_rows(N);
  FSDPP_CHECK(flow.training, "backward after a forward with training = false: the loss gradient was not prepared");
  if (stage_.heads(chunk_)) head_backward(flow, N, Nl);  // else a pipeline stage before the last: flow.dx has arrived
  const auto [begin, end] = chunk_blocks();
  for (std::size_t b = end; b-- > begin;) (*blocks_[b])(flow, Pass::backward);
  if (stage_.embeds(chunk_)) embed_backward(flow, flow.dx, N);  // else flow.dx leaves for the previous stage
}

void CausalLM::backward_weight(Flow& flow) {
  FSDPP_CHECK(flow.weight_stash, "a weight pass without the stash its backward recorded in");
  if (stage_.heads(chunk_)) flow.weight_stash->compute(*this);  // the head's
  const auto [begin, end] = chunk_blocks();
  for (std::size_t b = end; b-- > begin;) (*blocks_[b])(flow, Pass::backward_weight);
}

std::int64_t CausalLM::weight_stash_elements(int B, int T) const {
  const auto [begin, end] = chunk_blocks();
  const int local_T = context_->cp->active() ? context_->cp->local_length(T) : T;
  std::int64_t n = 0;
  for (std::size_t b = begin; b < end; ++b) n += blocks_[b]->weight_stash_elements(B, local_T);
  return n;
}

// From d(loss)/d(logits) (in the logits) to the gradient of the last block's output, in flow.dx.
void CausalLM::head_backward(Flow& flow, int N, int Nl) {
  const int C = config_.n_embd, Vl = static_cast<int>(head().rows());
  TensorParallelGroup& tp = *context_->tp;
  const bool sp = tp.sequence_parallel();
  Kokkos::deep_copy(head_.dlnf, 0.0f);
  linear_backward_input<float>(head_.dlnf, head_.logits, head().value(), N, C, Vl);
  // Every rank's vocabulary columns contributed to d(lnf): summed, or under sp reduce-scattered to this rank's rows,
  // while the head's weight gradient (the largest product) is computed (tensor_parallel.hpp). The tied wte gets
  // it before the embedding's backward adds its own, as without overlap.
  TpPending reduction = tp.reduce_region_gradient_async(head_.dlnf, head_.dlnf_local, N, C);
  linear_weight_gradients(flow, *this, Linear{head(), nullptr}, context_->chunks, head_.logits, head_.lnf, N, C, Vl,
                          OutputGradient::in_slot);
  // Reproducible mode with a tied embedding (fully_shard hands out its words): the head's part is cut into words
  // before the lookup adds its own, so the two parts sum exactly, as they do where a pipeline holds them on its
  // first and last stage (parallel/pipeline_parallel.hpp); token chunks cut each chunk's part already.
  const SlotWords& words = token_embedding.grad_words();
  if (!lm_head && stage_.embeds(chunk_) && words.active() && !context_->chunks.active() && !flow.weight_stash) {
    add_cut_into_slots(words, token_embedding.grad());
    Kokkos::deep_copy(token_embedding.grad(), 0.0f);
  }
  const View1<float> dlnf = tp.wait(reduction);
  Kokkos::deep_copy(head_.dx, 0.0f);
  if (sp) Kokkos::deep_copy(head_.norm_grads, 0.0f);
  final_norm.backward(head_.dx, tp.norm_gradients(final_norm.parameters(), head_.norm_grads, 0), dlnf, final_x_,
                      head_.lnf_stats, Nl, C, &context_->chunks);
  if (sp) tp.add_norm_gradients(head_.norm_grads, final_norm.parameters());  // each rank saw its rows only
  flow.dx = head_.dx;
}

}  // namespace fsdpp

namespace fsdpp {

// ---------------------------------------------------------------------------------------------------------
// Decoding with a KV cache (kv_cache.hpp)

KvCache CausalLM::make_kv_cache(int sequences, int capacity) const {
  FSDPP_REQUIRE(capacity >= 1 && capacity <= config_.context_length, "a KV cache of {} positions: a sequence can "
                "hold at most model.context_length = {} tokens (prompt and generated)", capacity, config_.context_length);
  const DecoderBlock::Local l = blocks_.front()->local();
  std::vector<bool> kept(sz(config_.n_layer), false);  // a pipeline stage caches its own blocks only
  for (const auto& b : blocks_) kept[sz(b->index_)] = true;
  return KvCache(config_.n_layer, sequences, capacity, l.kv_heads * l.head_size, &kept);
}

BufferTable CausalLM::decode_head_table(DecodeHead& h, int N, int S) const {
  const TensorParallelGroup& tp = *context_->tp;
  const std::int64_t C = config_.n_embd, chunk = chunk_rows(config_.vocab_size, tp.ranks());
  BufferTable t;
  t.add("last", sz(S * C), h.last);  // each sequence's last row of the residual stream
  t.add("lnf", sz(S * C), h.lnf);
  final_norm.add_stats(t, "lnf", sz(S), h.lnf_stats);
  t.add("logits", sz(tp.ranks() * S * chunk), h.logits);  // every tp rank's vocabulary block, gathered
  if (tp.active()) t.add("local_tokens", sz(N), h.local_tokens);
  return t;
}

std::int64_t CausalLM::kv_cache_bytes_for(int sequences, int capacity) const {
  const DecoderBlock::Local l = blocks_.front()->local();
  return KvCache::bytes_for(config_.n_layer, sequences, capacity, l.kv_heads * l.head_size);
}

std::int64_t CausalLM::decode_buffer_bytes_for(int sequences, int capacity, int rows) const {
  DecodeBuffers blocks;
  DecodeHead head;
  std::int64_t total =
      blocks_.front()->decode_table(blocks, rows, capacity).bytes() + decode_head_table(head, rows, sequences).bytes();
  for (const auto& b : blocks_)
    if (const MoeFeedForward* moe = b->moe()) {  // the sparse blocks' one decode set and the experts' scratch
      MoeActivations acts;
      MoeScratch scratch;
      return total + moe->activation_table(acts, rows).bytes() + moe->scratch_table(scratch, rows).bytes();
    }
  return total;
}

void CausalLM::decode_forward(Flow& flow) {
  DecodeStep& step = *flow.decode;
  TensorParallelGroup& tp = *context_->tp;
  const int N = step.N, S = step.cache->sequences(), C = config_.n_embd, V = config_.vocab_size;
  DecodeBuffers& d = context_->decode;
  d.buffers.ensure("decode", N, step.cache->capacity(),
                   [&] { return blocks_.front()->decode_table(d, N, step.cache->capacity()); });
  decode_head_buffers_.ensure("decode_lm", N, S, [&] { return decode_head_table(decode_head_, N, S); });
  DecodeHead& h = decode_head_;
  context_->rotary.ensure();

  // Chunk by chunk (the whole model is one): x = E[tokens] (+ P[positions]) before the first, under tensor
  // parallelism each rank's vocabulary rows, summed; a later pipeline stage's rows from the stage before.
  const std::size_t rows = sz(std::int64_t{N} * C);
  for (int c = 0; c < stage_.count(); ++c) {
    if (stage_.embeds(c)) {
      const View1<float> wpe = position_table && tp.rank() == 0 ? position_table->value() : View1<float>();
      if (tp.active()) {
        localize_tokens(h.local_tokens, step.tokens, tp.vocab_offset(V), N);
        embedding_at<float>(d.x[0], h.local_tokens, step.position, token_embedding.value(), wpe, N, C);
        tp.all_reduce(d.x[0], rows, ReduceOp::sum);
      } else {
        embedding_at<float>(d.x[0], step.tokens, step.position, token_embedding.value(), wpe, N, C);
      }
    } else {
      FSDPP_CHECK(step.stage_link, "a decode forward of a pipeline stage without its link to the other stages");
      step.stage_link->receive(d.x[0], rows, c);
    }
    flow.x = d.x[0];
    const std::size_t begin = chunk_begin_.empty() ? 0 : chunk_begin_[sz(c)];
    const std::size_t end = chunk_begin_.empty() ? blocks_.size() : chunk_begin_[sz(c) + 1];
    for (std::size_t b = begin; b < end; ++b) (*blocks_[b])(flow);
    if (!stage_.heads(c)) step.stage_link->send(flow.x, rows, c);
  }
  step.logits.assign(sz(std::int64_t{S} * V), 0.0f);
  if (!stage_.head) {  // the last stage's logits
    step.stage_link->share_logits(step.logits);
    return;
  }

  // Each sequence's last row through the final norm and the head: (S, Vl) logits in this rank's block of the
  // gathered buffer (rows of the padded chunk width), then every rank's block, then (S, V) on the host.
  gather_rows<float>(h.last, flow.x, step.last_row, S, C);
  final_norm.forward(h.lnf, h.lnf_stats, h.last, S, C);
  const int chunk = static_cast<int>(chunk_rows(V, tp.ranks())), Vl = static_cast<int>(head().rows());
  const std::size_t block = sz(std::int64_t{S} * chunk);
  linear_forward<float>(tp.own_block(h.logits, block), h.lnf, head().value(), View1<float>(), S, C, Vl, chunk, 0);
  tp.all_gather(h.logits, block);
  std::vector<float> gathered(h.logits.extent(0));
  Kokkos::deep_copy(HostView1<float>(gathered.data(), gathered.size()), h.logits);
  for (int r = 0; r < tp.ranks(); ++r) {
    const int first = r * chunk, width = std::max(0, std::min(chunk, V - first));
    for (int s = 0; s < S; ++s)
      std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>((sz(r) * S + sz(s)) * sz(chunk)), width,
                  step.logits.begin() + static_cast<std::ptrdiff_t>(sz(std::int64_t{s} * V + first)));
  }
  if (step.stage_link) step.stage_link->share_logits(step.logits);
}

}  // namespace fsdpp
