#include "fsdpp/nn/weight_gradient_stash.hpp"

#include "fsdpp/runtime/error.hpp"

namespace fsdpp {

namespace {

// `kept` takes a copy of n floats of `source`, or `shared` (the previous record's copy of the same buffer).
// A buffer this record shared before is never written: it is the previous record's.
void keep(View1<float>& kept, const View1<float>& source, std::size_t n, const View1<float>* shared,
          const View1<float>& previous) {
  if (shared) {
    kept = *shared;
    return;
  }
  if (kept.extent(0) != n || (previous.data() && kept.data() == previous.data()))
    kept = uninitialized<float>("fsdpp::weight_gradient_stash", n);
  Kokkos::deep_copy(kept, Kokkos::subview(source, std::make_pair(std::size_t{0}, n)));
}

}  // namespace

void WeightGradientStash::record(const Module& owner, const Linear& linear, GradientChunks& chunks,
                                 const View1<float>& dout, const View1<float>& inp, int N, int in, int out, int ld,
                                 int at, OutputGradient output_gradient) {
  if (recorded_ == records_.size()) records_.emplace_back();
  Record& r = records_[recorded_];
  const Record* before = recorded_ > 0 && records_[recorded_ - 1].owner == &owner ? &records_[recorded_ - 1] : nullptr;
  const std::size_t n_out = static_cast<std::size_t>(N) * static_cast<std::size_t>(ld);
  const std::size_t n_in = static_cast<std::size_t>(N) * static_cast<std::size_t>(in);
  // The projections of one packed output gradient (q, k and v of one dqkv) follow each other: one copy; so do the
  // MLP branches that read one input.
  r.copies_dout = output_gradient == OutputGradient::copy;
  r.shares_dout = r.copies_dout && before && before->copies_dout && before->dout_source == dout.data() &&
                  before->dout.extent(0) == n_out;
  if (r.copies_dout)
    keep(r.dout, dout, n_out, r.shares_dout ? &before->dout : nullptr, before ? before->dout : View1<float>());
  else
    r.dout = dout;
  r.dout_source = dout.data();
  // A module that recomputes in backward reads its activations from the set every recomputing module shares
  // (module.hpp): the next one's recomputation overwrites them before W, so they are copied too.
  r.copies_inp = owner.recomputes_in_backward();
  r.shares_inp = r.copies_inp && before && before->copies_inp && before->inp_source == inp.data() &&
                 before->inp.extent(0) == n_in;
  if (r.copies_inp)
    keep(r.inp, inp, n_in, r.shares_inp ? &before->inp : nullptr, before ? before->inp : View1<float>());
  else
    r.inp = inp;  // the slot's own activation, untouched until W frees the slot
  r.inp_source = inp.data();
  r.owner = &owner;
  r.weight = &linear.weight;
  r.bias = linear.bias;
  r.chunks = &chunks;
  r.N = N, r.in = in, r.out = out, r.ld = ld, r.at = at;
  r.pending = true;
  ++recorded_;
}

void WeightGradientStash::compute(const Module& owner) {
  for (std::size_t k = 0; k < recorded_; ++k) {
    Record& r = records_[k];
    if (!r.pending || r.owner != &owner) continue;
    const Linear linear{*r.weight, r.bias};
    linear.weight_gradients(*r.chunks, r.dout, r.inp, r.N, r.in, r.out, r.ld, r.at);
    r.pending = false;
    if (!r.copies_inp) r.inp = View1<float>();  // the slot's buffers: no longer held here
    if (!r.copies_dout) r.dout = View1<float>();
  }
}

void WeightGradientStash::finish() {
  for (std::size_t k = 0; k < recorded_; ++k)
    FSDPP_CHECK(!records_[k].pending, "the weight pass left {}'s weight gradient of '{}' uncomputed: its module did "
                "not run in Pass::backward_weight", records_[k].owner->display_name(), records_[k].weight->name());
  recorded_ = 0;
}

std::int64_t WeightGradientStash::elements() const {
  std::int64_t n = 0;
  for (const Record& r : records_) {
    if (r.copies_dout && !r.shares_dout) n += static_cast<std::int64_t>(r.dout.extent(0));
    if (r.copies_inp && !r.shares_inp) n += static_cast<std::int64_t>(r.inp.extent(0));
  }
  return n;
}

void linear_weight_gradients(const Flow& flow, const Module& owner, const Linear& linear, GradientChunks& chunks,
                             const View1<float>& dout, const View1<float>& inp, int N, int in, int out, int ld,
                             int at, OutputGradient output_gradient) {
  if (flow.weight_stash)
    return flow.weight_stash->record(owner, linear, chunks, dout, inp, N, in, out, ld, at, output_gradient);
  linear.weight_gradients(chunks, dout, inp, N, in, out, ld, at);
}

}  // namespace fsdpp
