#include "fsdpp/nn/decoder_block.hpp"

#include "fsdpp/nn/weight_gradient_stash.hpp"

#include "fsdpp/nn/attention_dispatch.hpp"
#include "fsdpp/nn/kernels/decode.hpp"
#include "fsdpp/nn/kernels/linear.hpp"
#include "fsdpp/nn/kernels/qk_norm.hpp"
#include "fsdpp/nn/kernels/residual.hpp"
#include "fsdpp/nn/kernels/rope.hpp"
#include "fsdpp/runtime/error.hpp"

namespace fsdpp {

using namespace kernels;

// ---------------------------------------------------------------------------------------------------------
// Buffers

void BlockActivations::ensure(const std::string& label, const DecoderBlock& block, int B, int T) {
  buffers.ensure(label, B, T, [&] { return block.activation_table(*this, B, T); });
}

BufferTable RotaryTables::table() {
  BufferTable t;
  if (!enabled) return t;
  const std::size_t n = sz(std::int64_t{context_length} * (head_size / 2));
  return t.add("cos", n, cos).add("sin", n, sin);
}

void RotaryTables::ensure() {
  if (!enabled || cos.extent(0) != 0) return;
  buffers.ensure("rope", context_length, head_size, [&] { return table(); });
  std::vector<double> ch, sh;
  rope_table(ch, sh, context_length, head_size, theta, scaling);
  auto cm = Kokkos::create_mirror_view(cos);
  auto sm = Kokkos::create_mirror_view(sin);
  for (std::size_t i = 0; i < ch.size(); ++i) cm(i) = static_cast<float>(ch[i]), sm(i) = static_cast<float>(sh[i]);
  Kokkos::deep_copy(cos, cm);
  Kokkos::deep_copy(sin, sm);
}

DecoderBlock::Local DecoderBlock::local() const {
  const int tp = context_->tp->ranks();
  Local l;
  l.heads = dims_.heads / tp;
  l.kv_heads = dims_.kv_heads / tp;
  l.head_size = dims_.head_size;
  l.attention_width = l.heads * l.head_size;
  l.qkv_width = (l.heads + 2 * l.kv_heads) * l.head_size;
  l.mlp_width = dims_.mlp_width / tp;
  return l;
}

// Saved by forward for backward; rows N of every feature the tensor-parallel regions compute, Nl of the residual
// stream and the norms' statistics.
BufferTable DecoderBlock::activation_table(BlockActivations& a, int B, int T) const {
  const Local l = local();
  const std::int64_t N = std::int64_t{B} * T, C = dims_.C, Nl = context_->tp->local_rows(static_cast<int>(N));
  BufferTable t;
  t.add("ln1", sz(N * C), a.ln1);  // norm1's output, gathered: the qkv projections' input
  parts_.attention_norm->add_stats(t, "ln1", sz(Nl), a.ln1_stats);
  t.add("qkv", sz(N * l.qkv_width), a.qkv);  // [q | k | v], q and k rotated (and normed first under q/k norms)
  const std::int64_t qk_heads = parts_.q_norm ? l.heads + l.kv_heads : 0;
  t.add("qk_raw", sz(N * qk_heads * l.head_size), a.qk_raw);  // q and k before their norms
  t.add("qk_rstd", sz(N * qk_heads), a.qk_rstd);
  // The attention probabilities (B,NHl,T,T), or the fused kernels' logsumexp (B,NHl,T).
  t.add("att", sz(std::int64_t{B} * l.heads * T * attention_row_floats(context_->attention, T)), a.att);
  t.add("atty", sz(N * l.attention_width), a.atty);  // attention output, Wo's input
  t.add("res2", sz(Nl * C), a.res2);                 // residual after attention
  t.add("ln2", sz(N * C), a.ln2);
  parts_.mlp_norm->add_stats(t, "ln2", sz(Nl), a.ln2_stats);
  const std::int64_t F = dense_mlp_table_width();
  for (std::size_t i = 0; i < kMaxMlpBranches; ++i)  // branch outputs, act()'s inputs (a model's blocks have
    if (i < parts_.mlp_in.size() || parts_.moe)      // one or two; sparse blocks size them for the dense ones)
      t.add("branch" + std::to_string(i), sz(N * F), a.branches[i]);
  t.add("h", sz(N * F), a.h);  // act(branches): Wd's input
  return t;
}

BufferTable DecoderBlock::scratch_table(BlockScratch& s, int B, int T) const {
  const Local l = local();
  const std::int64_t N = std::int64_t{B} * T, C = dims_.C, Nl = context_->tp->local_rows(static_cast<int>(N));
  BufferTable t;
  t.add("dres2", sz(N * C), s.dres2);  // gradient of the residual after attention
  t.add("dln", sz(N * C), s.dln);      // gradient of a norm's output
  t.add("dqkv", sz(N * l.qkv_width), s.dqkv);
  t.add("datty", sz(N * l.attention_width), s.datty);
  // (B,NHl,T,T) probability gradients; fused: (B,NHl,T), the row term D
  t.add("datt", sz(std::int64_t{B} * l.heads * T * attention_row_floats(context_->attention, T)), s.datt);
  const std::int64_t F = dense_mlp_table_width();
  t.add("dh", sz(N * F), s.dh);
  for (std::size_t i = 0; i < kMaxMlpBranches; ++i)
    if (i < parts_.mlp_in.size() || parts_.moe) t.add("dbranch" + std::to_string(i), sz(N * F), s.dbranches[i]);
  // model.attention batched: the batched kernels' workspace; empty otherwise
  t.add("workspace", sz(attention_workspace_floats(context_->attention, B, T, l.qkv_width, l.attention_width)),
        s.workspace);
  if (context_->tp->sequence_parallel()) {
    const std::size_t norm_params = parts_.attention_norm->parameters().size() + parts_.mlp_norm->parameters().size();
    t.add("gathered", sz(N * C), s.gathered);    // a gathered gradient, or a row-parallel layer's partial sums
    t.add("dln_local", sz(Nl * C), s.dln_local); // a norm output's gradient, reduce-scattered
    t.add("norm_grads", norm_params * sz(C), s.norm_grads);  // the norms' gradients of one backward, before their sum
  }
  // Qwen3's q/k norms under tp: this rank's heads' share of their gradients, before the sum over tp.
  if (context_->tp->active() && parts_.q_norm) t.add("qk_norm_grads", 2 * sz(l.head_size), s.qk_norm_grads);
  return t;
}

// A decode forward's rows are whole (no sequence parallelism): every row's norm, q/k/v, attention output and MLP.
BufferTable DecoderBlock::decode_table(DecodeBuffers& d, int N, int capacity) const {
  const Local l = local();
  const std::int64_t C = dims_.C;
  BufferTable t;
  t.add("x0", sz(N * C), d.x[0]).add("x1", sz(N * C), d.x[1]);
  t.add("ln1", sz(N * C), d.ln1);
  parts_.attention_norm->add_stats(t, "ln1", sz(N), d.ln1_stats);
  t.add("qkv", sz(std::int64_t{N} * l.qkv_width), d.qkv);
  t.add("scores", sz(std::int64_t{N} * l.heads * capacity), d.scores);  // each row's probabilities over the cache
  t.add("atty", sz(std::int64_t{N} * l.attention_width), d.atty);
  t.add("res2", sz(N * C), d.res2);
  t.add("ln2", sz(N * C), d.ln2);
  parts_.mlp_norm->add_stats(t, "ln2", sz(N), d.ln2_stats);
  const std::int64_t F = dense_mlp_table_width();
  for (std::size_t i = 0; i < kMaxMlpBranches; ++i)
    if (i < parts_.mlp_in.size() || parts_.moe) t.add("branch" + std::to_string(i), sz(N * F), d.branches[i]);
  t.add("h", sz(N * F), d.h);
  return t;
}

int DecoderBlock::dense_mlp_table_width() const { return context_->dense_mlp ? local().mlp_width : 0; }

std::int64_t DecoderBlock::output_bytes(int B, int T) const {
  return 4 * std::int64_t{context_->tp->local_rows(B * T)} * dims_.C;
}

std::int64_t DecoderBlock::activation_bytes() const {
  return acts_.own_bytes() + moe_acts_.own_bytes() + static_cast<std::int64_t>(out_.extent(0)) * 4;
}

BlockScratch& DecoderBlock::scratch_for(int B, int T) {
  BlockScratch& s = context_->scratch;
  s.buffers.ensure("block_scratch", B, T, [&] { return scratch_table(s, B, T); });
  return s;
}

MoeScratch& DecoderBlock::moe_scratch_for(int N) {
  MoeScratch& s = context_->moe_scratch;
  s.buffers.ensure("moe_scratch", N, 1, [&] { return parts_.moe->scratch_table(s, N); });
  return s;
}

void DecoderBlock::swap_activation_slot(int from, int to) {
  SlotState current{std::move(acts_.own()), std::move(moe_acts_.own()), {}, in_, out_, B_, T_};
  if (parts_.moe) parts_.moe->swap_forward_state(current.moe);
  slots_.swap(current, from, to);
  if (parts_.moe) parts_.moe->swap_forward_state(current.moe);
  acts_.own() = std::move(current.acts);
  moe_acts_.own() = std::move(current.moe_acts);
  in_ = current.in, out_ = current.out, B_ = current.B, T_ = current.T;
}

void DecoderBlock::ensure_output(int B, int T) {
  if (B == B_ && T == T_) return;
  B_ = B, T_ = T;
  out_ = uninitialized<float>(path() + ".out", sz(output_bytes(B, T) / 4));
}

// ---------------------------------------------------------------------------------------------------------
// Construction and tensor parallelism

DecoderBlock::DecoderBlock(std::string type_name, const BlockDims& dims, std::shared_ptr<BlockContext> context)
    : Module(std::move(type_name)), dims_(dims), context_(std::move(context)), acts_(
          std::shared_ptr<BlockActivations>(context_, &context_->recomputed)),
      moe_acts_(std::shared_ptr<MoeActivations>(context_, &context_->recomputed_moe)) {}

void DecoderBlock::assemble(BlockParts parts) {
  const bool dense = parts.mlp_out && !parts.mlp_in.empty() && parts.mlp_in.size() <= kMaxMlpBranches && !parts.moe;
  const bool sparse = parts.moe && !parts.mlp_out && parts.mlp_in.empty();
  FSDPP_CHECK(parts.attention_norm && parts.attention_out && parts.mlp_norm && !parts.qkv.empty() && (dense || sparse),
              "{}: a block needs two norms, qkv projections, an attention output projection and either 1 to {} MLP "
              "branches and an output projection or a mixture of experts", type_name(), kMaxMlpBranches);
  parts_ = std::move(parts);
}

void DecoderBlock::apply_tensor_parallel(const TensorParallelGroup& tp) {
  auto column_parallel = [&](const Linear& l, int blocks) {
    l.weight.set_tensor_parallel(tp.shard(0, blocks));
    if (l.bias) l.bias->set_tensor_parallel(tp.shard(0, blocks));
  };
  for (const QkvProjection& p : parts_.qkv) column_parallel(*p.linear, p.tp_blocks);
  for (const Linear* l : parts_.mlp_in) column_parallel(*l, 1);
  // A mixture of experts is not split: its router and experts are replicated over tp (check_tensor_parallel).
  parts_.attention_out->weight.set_tensor_parallel(tp.shard(1));
  if (parts_.mlp_out) parts_.mlp_out->weight.set_tensor_parallel(tp.shard(1));
}

// ---------------------------------------------------------------------------------------------------------
// Forward and backward, side by side. flow.x holds the block's input on entry and its output on exit; flow.dx
// holds d(out) on entry and d(in) on exit, in the same buffer (see CausalLM::backward).

namespace {
AttentionShape attention_shape(const DecoderBlock::Local& l, int B, int T, const BlockContext& context) {
  return AttentionShape{B, T, l.heads, l.kv_heads, l.head_size, context.attention_starts()};
}
}  // namespace

void DecoderBlock::norm_forward(const Norm& norm, const View1<float>& out, const NormStats& stats,
                                const View1<float>& in, int N) {
  TensorParallelGroup& tp = *context_->tp;
  const int C = dims_.C, Nl = tp.local_rows(N);
  const std::size_t local = sz(std::int64_t{Nl} * C);
  // Under sequence parallelism each norm writes its rows into its own block of the (N,C) buffer, which the
  // all-gather then completes: the input of the tensor-parallel region that follows.
  norm.forward(tp.sequence_parallel() ? tp.own_block(out, local) : out, stats, in, Nl, C);
  if (tp.sequence_parallel()) tp.all_gather(out, local);
}

void DecoderBlock::row_parallel_forward(const View1<float>& out, const View1<float>& inp, const Linear& l, int N,
                                        int in) {
  TensorParallelGroup& tp = *context_->tp;
  const int C = dims_.C;
  const View1<float> partial = tp.sequence_parallel() ? context_->scratch.gathered : out;
  linear_forward<float>(partial, inp, l.weight.value(), View1<float>(), N, in, C);
  tp.reduce_row_parallel(partial, out, N, C);
  if (l.bias) bias_forward<float>(out, l.bias->value(), tp.local_rows(N), C);
}

void DecoderBlock::forward(Flow& flow) {
  if (flow.decode) return decode_forward(flow);
  const int B = flow.B, T = flow.T, N = B * T, C = dims_.C;
  const Local l = local();
  TensorParallelGroup& tp = *context_->tp;
  const int Nl = tp.local_rows(N), W = l.qkv_width;
  BlockActivations& a = acts_.get(*this, *this, B, T);
  BlockScratch& s = scratch_for(B, T);
  ensure_output(B, T);
  context_->rotary.ensure();
  in_ = flow.x;

  // Attention: res2 = in + Wo attention(rotate(qkv(norm1(in))))
  norm_forward(*parts_.attention_norm, a.ln1, a.ln1_stats, in_, N);
  int at = 0;
  for (const QkvProjection& p : parts_.qkv) {
    const Linear& q = *p.linear;
    const int width = static_cast<int>(q.weight.rows());
    linear_forward<float>(a.qkv, a.ln1, q.weight.value(), q.bias_value(), N, C, width, W, at);
    at += width;
  }
  if (parts_.q_norm)
    qk_norm_forward<float>(a.qkv, a.qk_raw, a.qk_rstd, parts_.q_norm->weight.value(), parts_.k_norm->weight.value(), N,
                           W, l.heads, l.kv_heads, l.head_size, parts_.q_norm->eps());
  const RotaryTables& rope = context_->rotary;
  if (rope.enabled)
    rope_forward<float>(a.qkv, rope.cos, rope.sin, B, T, W, l.heads + l.kv_heads, l.head_size, context_->rope_starts(),
                        context_->rope_positions());
  // Only the batched kernels take the (shared) workspace; the others leave the scratch as it was.
  const bool batched = resolve_attention(context_->attention) == AttentionKind::batched;
  if (context_->cp->active())  // the ring; d(att)'s row-term scratch holds the running sums meanwhile
    context_->cp->attention_forward(a.atty, a.att, s.datt, a.qkv, attention_shape(l, B, T, *context_));
  else
    attention_forward_as(context_->attention, a.atty, a.att, a.qkv, batched ? s.workspace : View1<float>(),
                         attention_shape(l, B, T, *context_));
  // A recomputation rebuilds what backward reads and stops there: Wd and the last residual add only make the
  // output, which backward does not read (the next block, whose input it is, is already through its backward).
  // So out_ stays as forward left it, and Wo's output goes to the scratch d(res2), which backward overwrites
  // before it reads it.
  const std::size_t local = sz(std::int64_t{Nl} * C);
  const View1<float> proj = !is_recomputing() ? out_ : tp.sequence_parallel() ? tp.own_block(s.dres2, local) : s.dres2;
  row_parallel_forward(proj, a.atty, *parts_.attention_out, N, l.attention_width);
  residual_forward<float>(a.res2, in_, proj, std::int64_t{Nl} * C);

  // MLP: out = res2 + Wd act(branches(norm2(res2))), or res2 + experts(norm2(res2))
  norm_forward(*parts_.mlp_norm, a.ln2, a.ln2_stats, a.res2, N);
  if (parts_.moe) {  // a replay writes the output to the scratch d(res2), as Wo's above
    const View1<float> moe_out = is_recomputing() ? s.dres2 : out_;
    parts_.moe->forward(moe_out, a.ln2, N, moe_acts_.get(*this, *parts_.moe, N), moe_scratch_for(N),
                        is_recomputing() ? nullptr : context_->recording, sparse_index_);
    if (is_recomputing()) return;
    residual_forward<float>(out_, a.res2, out_, std::int64_t{Nl} * C);
    flow.x = out_;
    return;
  }
  for (std::size_t i = 0; i < parts_.mlp_in.size(); ++i) {
    const Linear& b = *parts_.mlp_in[i];
    linear_forward<float>(a.branches[i], a.ln2, b.weight.value(), b.bias_value(), N, C, l.mlp_width);
  }
  mlp_activation(a.h, a.branches, std::int64_t{N} * l.mlp_width);
  if (is_recomputing()) return;  // the replay ends here, before recompute_stops_before() (the time model reads it)
  row_parallel_forward(out_, a.h, *recompute_stops_before(), N, l.mlp_width);
  residual_forward<float>(out_, a.res2, out_, std::int64_t{Nl} * C);
  flow.x = out_;
}

// The decode forward: the training forward's kernels over the rows, with the keys and values of every position
// kept in the cache, and Megatron's all-reduce after each row-parallel layer (no sequence parallelism).
void DecoderBlock::decode_forward(Flow& flow) {
  const DecodeStep& step = *flow.decode;
  const int N = step.N, C = dims_.C;
  const Local l = local();
  TensorParallelGroup& tp = *context_->tp;
  KvCache& cache = *step.cache;
  const int W = l.qkv_width, kv_width = l.kv_heads * l.head_size, capacity = cache.capacity();
  DecodeBuffers& d = context_->decode;
  d.buffers.ensure("decode", N, capacity, [&] { return decode_table(d, N, capacity); });
  const View1<float> in = flow.x, out = in.data() == d.x[0].data() ? d.x[1] : d.x[0];
  auto row_parallel = [&](const View1<float>& y, const View1<float>& x, const Linear& layer, int width) {
    linear_forward<float>(y, x, layer.weight.value(), View1<float>(), N, width, C);
    tp.all_reduce(y, sz(std::int64_t{N} * C), ReduceOp::sum);
    if (layer.bias) bias_forward<float>(y, layer.bias->value(), N, C);
  };

  // Attention over the cache: res2 = in + Wo attention(rotate(qkv(norm1(in))))
  parts_.attention_norm->forward(d.ln1, d.ln1_stats, in, N, C);
  int at = 0;
  for (const QkvProjection& p : parts_.qkv) {
    const Linear& q = *p.linear;
    const int width = static_cast<int>(q.weight.rows());
    linear_forward<float>(d.qkv, d.ln1, q.weight.value(), q.bias_value(), N, C, width, W, at);
    at += width;
  }
  if (parts_.q_norm)
    qk_norm_forward<float>(d.qkv, View1<float>(), View1<float>(), parts_.q_norm->weight.value(),
                           parts_.k_norm->weight.value(), N, W, l.heads, l.kv_heads, l.head_size, parts_.q_norm->eps());
  const RotaryTables& rope = context_->rotary;
  if (rope.enabled) rope_forward_at<float>(d.qkv, rope.cos, rope.sin, step.position, N, W, l.heads + l.kv_heads, l.head_size);
  kv_cache_append<float>(cache.k(index_), cache.v(index_), d.qkv, step.sequence, step.position, N, l.attention_width,
                         kv_width, capacity);
  attention_decode<float>(d.atty, d.scores, d.qkv, cache.k(index_), cache.v(index_), step.sequence, step.position, N,
                          l.heads, l.kv_heads, l.head_size, capacity);
  row_parallel(out, d.atty, *parts_.attention_out, l.attention_width);
  residual_forward<float>(d.res2, in, out, std::int64_t{N} * C);

  // MLP: out = res2 + Wd act(branches(norm2(res2))), or res2 + experts(norm2(res2))
  parts_.mlp_norm->forward(d.ln2, d.ln2_stats, d.res2, N, C);
  if (parts_.moe) {
    context_->decode_moe.ensure("decode", *parts_.moe, N);
    parts_.moe->forward(out, d.ln2, N, context_->decode_moe, moe_scratch_for(N), nullptr, sparse_index_);
    residual_forward<float>(out, d.res2, out, std::int64_t{N} * C);
    flow.x = out;
    return;
  }
  for (std::size_t i = 0; i < parts_.mlp_in.size(); ++i) {
    const Linear& b = *parts_.mlp_in[i];
    linear_forward<float>(d.branches[i], d.ln2, b.weight.value(), b.bias_value(), N, C, l.mlp_width);
  }
  mlp_activation(d.h, d.branches, std::int64_t{N} * l.mlp_width);
  row_parallel(out, d.h, *parts_.mlp_out, l.mlp_width);
  residual_forward<float>(out, d.res2, out, std::int64_t{N} * C);
  flow.x = out;
}

// Each column-parallel region's input gradient is reduced over tp while weight gradients are computed (Megatron's
// overlap, tensor_parallel.hpp): its dX products first, then the collective is started, then dW products that
// neither read nor write the collective's buffers, then the wait. Every buffer gets its += in the order of a plain
// backward, and the products are the same calls, so the bits do not depend on comm.overlap. Every collective is
// waited here: the next block's backward (or recomputation) writes the same scratch.
void DecoderBlock::backward(Flow& flow) {
  const Local l = local();
  BlockScratch& s = scratch_for(flow.B, flow.T);
  const BlockActivations& a = acts_.get(*this, *this, flow.B, flow.T);
  if (context_->tp->sequence_parallel()) Kokkos::deep_copy(s.norm_grads, 0.0f);
  const View1<float> dres2 = mlp_backward(flow, s, a, l);
  attention_backward_to_qkv(flow, s, a, l);
  qkv_backward(flow, s, a, l, dres2);
}

void DecoderBlock::mlp_in_weight_gradients(const Flow& flow, BlockScratch& s, const BlockActivations& a,
                                           const Local& l, int N) {
  for (std::size_t i = 0; i < parts_.mlp_in.size(); ++i)
    linear_weight_gradients(flow, *this, *parts_.mlp_in[i], context_->chunks, s.dbranches[i], a.ln2, N, dims_.C,
                            l.mlp_width);
}

// MLP: out = res2 + Wd act(branches(norm2(res2))), or res2 + experts(norm2(res2))
View1<float> DecoderBlock::mlp_backward(Flow& flow, BlockScratch& s, const BlockActivations& a, const Local& l) {
  const int N = flow.B * flow.T, C = dims_.C;
  TensorParallelGroup& tp = *context_->tp;
  const bool sp = tp.sequence_parallel();
  const int Nl = tp.local_rows(N);
  const std::size_t local = sz(std::int64_t{Nl} * C);
  const View1<float>& dout = flow.dx;
  View1<float> dln2 = s.dln;
  Kokkos::deep_copy(s.dln, 0.0f);
  if (parts_.moe) {  // not split by tp, no sequence parallelism: every row, every feature, the same on each tp rank
    parts_.moe->backward(s.dln, dout, a.ln2, N, moe_acts_.get(*this, *parts_.moe, N), moe_scratch_for(N),
                         context_->router.get(), flow.loss_scale);
  } else {
    const Linear& down = *parts_.mlp_out;
    const View1<float> dout_rows = tp.gather_rows(dout, s.gathered, N, C);  // (N,C): Wd's output gradient
    Kokkos::deep_copy(s.dh, 0.0f);
    linear_backward_input<float>(s.dh, dout_rows, down.weight.value(), N, l.mlp_width, C);
    mlp_activation_backward(s.dbranches, s.dh, a.branches, std::int64_t{N} * l.mlp_width);
    for (std::size_t i = 0; i < parts_.mlp_in.size(); ++i)
      linear_backward_input<float>(s.dln, s.dbranches[i], parts_.mlp_in[i]->weight.value(), N, C, l.mlp_width);
    TpPending reduction = tp.reduce_region_gradient_async(s.dln, s.dln_local, N, C);  // every rank's features fed it
    linear_weight_gradients(flow, *this, down, context_->chunks, dout_rows, a.h, N, l.mlp_width, C);
    if (!sp) mlp_in_weight_gradients(flow, s, a, l, N);  // under sp, they overlap attention's all-gather
    dln2 = tp.wait(reduction);
  }
  const View1<float> dres2 = sp ? tp.own_block(s.dres2, local) : s.dres2;  // this rank's rows (all without sp)
  Kokkos::deep_copy(dres2, dout);  // the residual path
  const int mlp_norm_slot = static_cast<int>(parts_.attention_norm->parameters().size());
  parts_.mlp_norm->backward(dres2, tp.norm_gradients(parts_.mlp_norm->parameters(), s.norm_grads, mlp_norm_slot), dln2,
                           a.res2, a.ln2_stats, Nl, C, &context_->chunks);
  return dres2;
}

// Attention: res2 = in + Wo attention(rotate(qkv(norm1(in))))
void DecoderBlock::attention_backward_to_qkv(Flow& flow, BlockScratch& s, const BlockActivations& a, const Local& l) {
  const int B = flow.B, T = flow.T, N = B * T, C = dims_.C, W = l.qkv_width;
  TensorParallelGroup& tp = *context_->tp;
  if (tp.sequence_parallel()) {  // Wo's output gradient, every row
    TpPending gather = tp.all_gather_async(s.dres2, sz(std::int64_t{tp.local_rows(N)} * C));
    mlp_in_weight_gradients(flow, s, a, l, N);
    tp.wait(gather);
  }
  const Linear& wo = *parts_.attention_out;
  Kokkos::deep_copy(s.datty, 0.0f);
  linear_backward_input<float>(s.datty, s.dres2, wo.weight.value(), N, l.attention_width, C);
  Kokkos::deep_copy(s.dqkv, 0.0f);
  if (context_->cp->active())
    context_->cp->attention_backward(s.dqkv, s.datt, s.datty, a.qkv, a.atty, a.att, attention_shape(l, B, T, *context_));
  else
    attention_backward_as(context_->attention, s.dqkv, s.datt, s.datty, a.qkv, a.atty, a.att, s.workspace,
                          attention_shape(l, B, T, *context_));
  const RotaryTables& rope = context_->rotary;
  if (rope.enabled)
    rope_backward<float>(s.dqkv, rope.cos, rope.sin, B, T, W, l.heads + l.kv_heads, l.head_size,
                         context_->rope_starts(), context_->rope_positions());
  if (parts_.q_norm && context_->chunks.active()) qk_norm_chunked_backward(s.dqkv, a, N, W, l);
  else if (parts_.q_norm) qk_norm_backward_unchunked(s, a, N, l);
}

void DecoderBlock::qk_norm_backward_unchunked(BlockScratch& s, const BlockActivations& a, int N, const Local& l) {
  TensorParallelGroup& tp = *context_->tp;
  // Under tp each rank normalises its own heads with the shared weights: their gradients are summed over tp.
  const std::size_t hs = sz(l.head_size);
  const bool split = tp.active();
  if (split) Kokkos::deep_copy(s.qk_norm_grads, 0.0f);
  const View1<float> dwq = split ? View1<float>(Kokkos::subview(s.qk_norm_grads, std::make_pair(std::size_t{0}, hs)))
                                 : parts_.q_norm->weight.grad();
  const View1<float> dwk = split ? View1<float>(Kokkos::subview(s.qk_norm_grads, std::make_pair(hs, 2 * hs)))
                                 : parts_.k_norm->weight.grad();
  qk_norm_backward<float>(s.dqkv, dwq, dwk, a.qk_raw, a.qk_rstd, parts_.q_norm->weight.value(),
                          parts_.k_norm->weight.value(), N, l.qkv_width, l.heads, l.kv_heads, l.head_size);
  if (split) tp.add_norm_gradients(s.qk_norm_grads, {&parts_.q_norm->weight, &parts_.k_norm->weight});
}

void DecoderBlock::qkv_backward(Flow& flow, BlockScratch& s, const BlockActivations& a, const Local& l,
                                const View1<float>& dres2) {
  const int N = flow.B * flow.T, C = dims_.C, W = l.qkv_width;
  TensorParallelGroup& tp = *context_->tp;
  const int Nl = tp.local_rows(N);
  const auto each_qkv = [&](const auto& f) {  // f(projection, its width, its first column in the packed row)
    int at = 0;
    for (const QkvProjection& p : parts_.qkv) {
      const int width = static_cast<int>(p.linear->weight.rows());
      f(*p.linear, width, at);
      at += width;
    }
  };
  Kokkos::deep_copy(s.dln, 0.0f);
  each_qkv([&](const Linear& q, int width, int at) {
    linear_backward_input<float>(s.dln, s.dqkv, q.weight.value(), N, C, width, W, at);
  });
  TpPending reduction = tp.reduce_region_gradient_async(s.dln, s.dln_local, N, C);
  linear_weight_gradients(flow, *this, *parts_.attention_out, context_->chunks, s.dres2, a.atty, N, l.attention_width,
                          C);
  each_qkv([&](const Linear& q, int width, int at) {
    linear_weight_gradients(flow, *this, q, context_->chunks, s.dqkv, a.ln1, N, C, width, W, at);
  });
  const View1<float> dln1 = tp.wait(reduction);
  const View1<float>& dout = flow.dx;
  Kokkos::deep_copy(dout, dres2);  // the residual path, into the caller's buffer: d(out) is no longer needed
  parts_.attention_norm->backward(dout, tp.norm_gradients(parts_.attention_norm->parameters(), s.norm_grads, 0), dln1,
                                 in_, a.ln1_stats, Nl, C, &context_->chunks);
  // The norms saw this rank's rows only: their gradients summed over tp, then added.
  if (tp.sequence_parallel()) {
    std::vector<Parameter*> norms = parts_.attention_norm->parameters();
    for (Parameter* p : parts_.mlp_norm->parameters()) norms.push_back(p);
    tp.add_norm_gradients(s.norm_grads, norms);
  }
}

void DecoderBlock::backward_weight(Flow& flow) {
  FSDPP_CHECK(flow.weight_stash, "{}: a weight pass without the stash its backward recorded in", display_name());
  flow.weight_stash->compute(*this);
  // A sparse block's experts computed their weight gradients in I; their module passes through W too, so that a
  // unit of their own (expert parallelism) synchronizes them when every other unit does (pipeline_gradient_sync).
  if (parts_.moe) parts_.moe->experts(flow, Pass::backward_weight);
}

// What backward above records under zero_bubble (weight_gradient_stash.hpp), one copy per output gradient: Wd's
// (N,C) and each MLP branch's (N,Fl) (a sparse block's experts are not deferred), Wo's (N,C), the packed qkv's
// (N,W); recomputing, the inputs too: Wd's h (N,Fl), the branches' ln2 (N,C), Wo's atty (N,Al), qkv's ln1 (N,C).
std::int64_t DecoderBlock::weight_stash_elements(int B, int T) const {
  const Local l = local();
  const std::int64_t N = std::int64_t{B} * T, C = dims_.C;
  const std::int64_t mlp = parts_.moe ? 0 : C + static_cast<std::int64_t>(parts_.mlp_in.size()) * l.mlp_width;
  const std::int64_t inputs = !recomputes_in_backward() ? 0 : (parts_.moe ? 0 : l.mlp_width + C) + l.attention_width + C;
  return N * (mlp + C + l.qkv_width + inputs);
}

// Qwen3's q/k norms under reproducible chunks: each chunk's rows (the input gradient is row-wise, the weights' a
// column sum), the weights' parts summed over tp for each chunk before they are cut, as add_norm_gradients sums
// the whole.
void DecoderBlock::qk_norm_chunked_backward(const View1<float>& dqkv, const BlockActivations& a, int N, int W,
                                            const Local& l) {
  TensorParallelGroup& tp = *context_->tp;
  const int H = l.heads + l.kv_heads, hs = l.head_size;
  context_->chunks.sum(&parts_.q_norm->weight, &parts_.k_norm->weight, N,
                       [&](const View1<float>& dwq, const View1<float>& dwk, int row0, int rows) {
                         qk_norm_backward<float>(chunk_rows(dqkv, row0, rows, W), dwq, dwk,
                                                 chunk_rows(a.qk_raw, row0, rows, H * hs),
                                                 chunk_rows(a.qk_rstd, row0, rows, H), parts_.q_norm->weight.value(),
                                                 parts_.k_norm->weight.value(), rows, W, l.heads, l.kv_heads, hs);
                         if (!tp.active()) return;
                         tp.all_reduce(dwq, dwq.extent(0), ReduceOp::sum);
                         tp.all_reduce(dwk, dwk.extent(0), ReduceOp::sum);
                       });
}

}  // namespace fsdpp
