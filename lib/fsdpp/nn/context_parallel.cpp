#include "fsdpp/nn/context_parallel.hpp"

#include "fsdpp/nn/kernels/document.hpp"
#include "fsdpp/nn/kernels/flash_attention.hpp"
#include "fsdpp/nn/kernels/ring_attention.hpp"
#include "fsdpp/runtime/error.hpp"

#include <chrono>
#include <utility>

namespace fsdpp {

using namespace kernels;

ContextParallelGroup::ContextParallelGroup(int ranks, int rank, Communicator* comm)
    : ranks_(ranks), rank_(rank), comm_(comm) {
  FSDPP_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && (ranks == 1 || comm),
              "ContextParallelGroup: rank {} of {} ranks needs a communicator of that size", rank, ranks);
  const std::size_t n = static_cast<std::size_t>(ranks);
  send_counts_.assign(n, 0), send_displs_.assign(n, 0), recv_counts_.assign(n, 0), recv_displs_.assign(n, 0);
}

void ContextParallelGroup::configure(int kv_width, bool document_masks) {
  kv_width_ = kv_width;
  document_masks_ = document_masks;
  buffers_ = Buffers(Growth::exact);  // the next batch allocates the new table
}

void ContextParallelGroup::set_fixed_order(int q_width, int heads) {
  FSDPP_CHECK(kv_width_ > 0, "context parallelism: set_fixed_order before configure");
  fixed_order_ = true;
  q_width_ = q_width;
  heads_ = heads;
  buffers_ = Buffers(Growth::exact);
}

BufferTable ContextParallelGroup::buffer_table(int B, int T_local) {
  const int kv_width = kv_width_;
  const std::size_t rows = static_cast<std::size_t>(B) * static_cast<std::size_t>(T_local);
  const std::size_t block = rows * static_cast<std::size_t>(kv_width);
  BufferTable t;
  if (fixed_order_) {  // whole sequences' rows of every rank
    const std::size_t whole = rows * static_cast<std::size_t>(ranks_), W = static_cast<std::size_t>(q_width_ + kv_width);
    const std::size_t stats = whole * static_cast<std::size_t>(heads_);
    t.add("gathered", whole * W, gathered_).add("whole_inp", whole * W, whole_inp_);
    t.add("whole_out", whole * q_width_, whole_out_).add("whole_dout", whole * q_width_, whole_dout_);
    t.add("whole_dinp", whole * W, whole_dinp_);
    t.add("whole_lse", stats, whole_lse_).add("whole_delta", stats, whole_delta_);
    return t;
  }
  // the ring: the block computed on and the one arriving; the blocks' gradient partial sums arriving and leaving
  t.add("kv0", block, kv_[0]).add("kv1", block, kv_[1]);
  t.add("dkv_in", block, dkv_in_).add("dkv_out", block, dkv_out_);
  return t;
}

void ContextParallelGroup::ensure_buffers(int B, int T_local) {
  buffers_.ensure("cp", B, T_local, [&] { return buffer_table(B, T_local); });
}

std::uint64_t ContextParallelGroup::ring_bytes_per_step(int ranks, int B, int T_local, int kv_width, int layers) {
  if (ranks <= 1) return 0;
  return std::uint64_t(layers) * std::uint64_t(hop_bytes(B, T_local, kv_width)) * std::uint64_t(3 * ranks - 2);
}

void ContextParallelGroup::add_rows(BufferTable& t, LocalRows& rows, int B, int T_local) const {
  const std::size_t n = static_cast<std::size_t>(B) * static_cast<std::size_t>(T_local);
  t.add("cp_tokens", n, rows.tokens).add("cp_targets", n, rows.targets).add("cp_positions", n, rows.positions);
  if (document_masks_) {  // document starts over the whole rows, then this rank's
    t.add("cp_full_starts", n * static_cast<std::size_t>(ranks_), rows.full_starts);
    t.add("cp_starts", n, rows.starts);
  }
}

void ContextParallelGroup::localize(const LocalRows& rows, const View1<const std::int32_t>& tokens,
                                    const View1<const std::int32_t>& targets, int B, int T, int eot_id) {
  FSDPP_CHECK(T % (2 * ranks_) == 0, "context parallelism: sequence length {} is not a multiple of 2 x cp = {}", T,
              2 * ranks_);
  FSDPP_CHECK((eot_id >= 0) == document_masks_, "context parallelism: localize with eot_id {} but configured {} "
              "document masks", eot_id, document_masks_ ? "with" : "without");
  const int Tl = local_length(T), c = T / (2 * ranks_);
  FSDPP_CHECK(rows.tokens.extent(0) == static_cast<std::size_t>(B) * static_cast<std::size_t>(Tl),
              "context parallelism: localize into rows for {} local positions, not B x T/cp = {} x {}",
              rows.tokens.extent(0), B, Tl);
  if (eot_id >= 0) document_starts(rows.full_starts, tokens, B, T, eot_id);
  cp_localize(rows.tokens, rows.targets, rows.positions, rows.starts, tokens, targets,
              eot_id >= 0 ? View1<const std::int32_t>(rows.full_starts) : View1<const std::int32_t>(), B, T, c,
              sequence_chunk_of(rank_, 0, ranks_), sequence_chunk_of(rank_, 1, ranks_));
  use_rows(rows);
}

RingBlock ContextParallelGroup::block(const AttentionShape& s, int source) const {
  RingBlock r;
  r.B = s.B, r.Tl = s.T, r.c = s.T / 2, r.NH = s.NH, r.NKV = s.NKV, r.hs = s.hs, r.starts = s.starts;
  for (int p = 0; p < 2; ++p) {
    r.q_chunks[p] = sequence_chunk_of(rank_, p, ranks_);
    r.k_chunks[p] = sequence_chunk_of(source, p, ranks_);
  }
  return r;
}

void ContextParallelGroup::sum_over_ranks(std::vector<double>& values) {
  if (!active() || values.empty()) return;
  if (sums_.extent(0) < values.size()) sums_ = View1<double>("cp.sums", values.size());
  const auto used = Kokkos::subview(sums_, std::make_pair(std::size_t{0}, values.size()));
  Kokkos::deep_copy(used, HostView1<double>(values.data(), values.size()));
  if (!comm_->stream_ordered()) Kokkos::fence();
  comm_->all_reduce(sums_.data(), values.size(), DType::f64, ReduceOp::sum);
  Kokkos::deep_copy(HostView1<double>(values.data(), values.size()), used);
}

WorkHandle ContextParallelGroup::shift(const View1<float>& send, const View1<float>& recv) {
  const std::size_t next = static_cast<std::size_t>((rank_ + 1) % ranks_);
  const std::size_t prev = static_cast<std::size_t>((rank_ + ranks_ - 1) % ranks_);
  send_counts_[next] = hop_count_;
  recv_counts_[prev] = hop_count_;
  // MPI reads the buffers from the host on its own thread: the kernels that wrote them must be done.
  if (!comm_->stream_ordered()) Kokkos::fence();
  ++stats_.exchanges;
  stats_.bytes_sent += hop_count_ * sizeof(float);
  return comm_->all_to_all_v_async(send.data(), recv.data(),
                                   AllToAllCounts{send_counts_.data(), send_displs_.data(), recv_counts_.data(),
                                                  recv_displs_.data()},
                                   DType::f32);
}

void ContextParallelGroup::wait(WorkHandle& work) {
  const auto t0 = std::chrono::steady_clock::now();
  work->wait();
  work.reset();
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class Kernels> void ContextParallelGroup::timed(const Kernels& kernels) {
  const auto t0 = std::chrono::steady_clock::now();
  kernels();
  Kokkos::fence();  // the kernels' time, not their launch's (a GPU build pays a sync per ring step for the figure)
  stats_.compute_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

RingBlock ContextParallelGroup::prepare(const AttentionShape& s) {
  const int KW = 2 * s.NKV * s.hs;
  FSDPP_CHECK(KW == kv_width_, "context parallelism: a block of key/value width {}, configured for {}", KW, kv_width_);
  ensure_buffers(s.B, s.T);
  hop_count_ = static_cast<std::size_t>(hop_bytes(s.B, s.T, KW)) / sizeof(float);
  return block(s, rank_);
}

// Step k computes with the block of rank r - k while the block of rank r - k - 1 arrives.
void ContextParallelGroup::attention_forward(const View1<float>& out, const View1<float>& lse,
                                             const View1<float>& row_sums, const View1<const float>& inp,
                                             const AttentionShape& s) {
  if (fixed_order_) return fixed_order_forward(out, lse, inp, s);
  const RingBlock own = prepare(s);
  ring_pack_kv<float>(kv_[0], inp, own);
  Kokkos::deep_copy(out, 0.0f);
  Kokkos::deep_copy(lse, 0.0f);
  Kokkos::deep_copy(row_sums, 0.0f);
  int current = 0;
  for (int k = 0; k < ranks_; ++k) {
    WorkHandle next;
    if (k + 1 < ranks_) next = shift(kv_[current], kv_[1 - current]);
    timed([&] {
      ring_forward_step<float>(out, lse, row_sums, inp, kv_[current], block(s, (rank_ - k + ranks_) % ranks_));
    });
    if (next) wait(next);
    current = 1 - current;
  }
  ring_finish<float>(out, lse, row_sums, own);
}

// Step k: the block of rank r - k (its hop to r + 1 issued first), dq += its keys' part (while the partial sums of
// ranks r - k .. r - 1 for it arrive), then its dk, dv: those partial sums plus this rank's queries' part, passed on
// to r + 1. After the last step the partial sums that arrive are this rank's own block's, complete.
void ContextParallelGroup::attention_backward(const View1<float>& dinp, const View1<float>& delta,
                                              const View1<const float>& dout, const View1<const float>& inp,
                                              const View1<const float>& out, const View1<const float>& lse,
                                              const AttentionShape& s) {
  if (fixed_order_) return fixed_order_backward(dinp, dout, inp, out, lse, s);
  const RingBlock own = prepare(s);
  flash_detail::row_delta<float>(delta, dout, out, own.local_shape());
  const View1<const float> D = delta;
  ring_pack_kv<float>(kv_[0], inp, own);
  int current = 0;
  WorkHandle partial;  // the previous step's partial sums on their way to rank + 1 (and ours from rank - 1)
  for (int k = 0; k < ranks_; ++k) {
    WorkHandle next;
    if (k + 1 < ranks_) next = shift(kv_[current], kv_[1 - current]);
    const RingBlock visiting = block(s, (rank_ - k + ranks_) % ranks_);
    timed([&] { ring_backward_queries<float>(dinp, D, dout, inp, lse, kv_[current], visiting); });
    if (partial) wait(partial);  // dkv_in holds ranks r-k .. r-1's sums for this block; dkv_out is free again
    timed([&] {
      ring_backward_keys<float>(dkv_out_, partial_view(k), D, dout, inp, lse, kv_[current], visiting);
    });
    partial = shift(dkv_out_, dkv_in_);
    if (next) wait(next);
    current = 1 - current;
  }
  wait(partial);
  ring_unpack_dkv<float>(dinp, dkv_in_, own);
}

void ContextParallelGroup::gather_whole(const View1<float>& whole, const View1<const float>& local, std::int64_t outer,
                                        int Tl, int width) {
  const std::size_t count = static_cast<std::size_t>(outer) * static_cast<std::size_t>(Tl) * static_cast<std::size_t>(width);
  if (!comm_->stream_ordered()) Kokkos::fence();
  ++stats_.exchanges;
  stats_.bytes_sent += count * sizeof(float);
  const auto t0 = std::chrono::steady_clock::now();
  comm_->all_gather(local.data(), gathered_.data(), count, DType::f32);
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cp_whole_from_gathered<float>(whole, gathered_, outer, Tl / 2, width, ranks_);
}

AttentionShape ContextParallelGroup::whole_shape(const AttentionShape& s) const {
  AttentionShape w = s;
  w.T = s.T * ranks_;
  w.starts = document_masks_ ? rows_.full_starts.data() : nullptr;  // localize's, over the whole rows
  return w;
}

// The whole sequences through cp 1's kernel; this rank's rows of its output and log-sum-exp kept.
void ContextParallelGroup::fixed_order_forward(const View1<float>& out, const View1<float>& lse,
                                               const View1<const float>& inp, const AttentionShape& s) {
  FSDPP_CHECK(s.q_width() == q_width_ && s.NH == heads_, "context parallelism: fixed order set for {} heads of width "
              "{}, called with {} of {}", heads_, q_width_, s.NH, s.q_width());
  ensure_buffers(s.B, s.T);
  const AttentionShape w = whole_shape(s);
  const int c = s.T / 2;
  gather_whole(whole_inp_, inp, s.B, s.T, s.row_width());
  timed([&] { flash_attention_forward<float>(whole_out_, whole_lse_, whole_inp_, w); });
  const int c0 = sequence_chunk_of(rank_, 0, ranks_), c1 = sequence_chunk_of(rank_, 1, ranks_);
  cp_local_from_whole<float>(out, whole_out_, s.B, c, w.T, s.q_width(), c0, c1, false);
  cp_local_from_whole<float>(lse, whole_lse_, std::int64_t{s.B} * s.NH, c, w.T, 1, c0, c1, false);
}

// Every rank's rows, outputs, output gradients and log-sum-exps gathered, cp 1's backward over the whole sequences,
// and this rank's rows of [dq | dk | dv] added: each complete, none summed over ranks.
void ContextParallelGroup::fixed_order_backward(const View1<float>& dinp, const View1<const float>& dout,
                                                const View1<const float>& inp, const View1<const float>& out,
                                                const View1<const float>& lse, const AttentionShape& s) {
  ensure_buffers(s.B, s.T);
  const AttentionShape w = whole_shape(s);
  const int c = s.T / 2;
  gather_whole(whole_inp_, inp, s.B, s.T, s.row_width());
  gather_whole(whole_out_, out, s.B, s.T, s.q_width());
  gather_whole(whole_dout_, dout, s.B, s.T, s.q_width());
  gather_whole(whole_lse_, lse, std::int64_t{s.B} * s.NH, s.T, 1);
  Kokkos::deep_copy(whole_dinp_, 0.0f);
  timed([&] {
    flash_attention_backward<float>(whole_dinp_, whole_delta_, whole_dout_, whole_inp_, whole_out_, whole_lse_, w);
  });
  cp_local_from_whole<float>(dinp, whole_dinp_, s.B, c, w.T, s.row_width(), sequence_chunk_of(rank_, 0, ranks_),
                             sequence_chunk_of(rank_, 1, ranks_), true);
}

}  // namespace fsdpp

#include "fsdpp/nn/language_model.hpp"

namespace fsdpp {

void LanguageModel::apply_context_parallel(std::shared_ptr<ContextParallelGroup> cp) {
  FSDPP_REQUIRE(!cp || !cp->active(), "mesh.cp is {}, but {} cannot run context parallelism: use mesh.cp: 1 for it",
                cp->ranks(), describe());
}

}  // namespace fsdpp
