#pragma once
// WeightGradientStash: zero_bubble's split of a backward (parallel/pipeline_schedule.hpp, ZB-H1) into the input
// gradient (I: what the previous stage waits for) and the weight gradient (W: run later, in the bubble).
//
//   I  model(flow, Pass::backward) with flow.weight_stash set: every Linear's dW = dout^T @ inp (and db) is not
//      computed but recorded, with a copy of dout (the backward's scratch is reused by the next block) and a
//      handle on inp (an activation of the micro-batch's slot, which stays untouched until W frees it).
//   W  model(flow, Pass::backward_weight) with the same stash: each module computes what it recorded, through the
//      same call (Linear::weight_gradients) on the same values, so the gradients are those of a whole backward.
//
// What stays in I: norms' and the embedding's gradients (row sums, cheap). The head's weight gradient is deferred
// too, without a copy: its output gradient (the logits' (N, V)) and input are buffers of the micro-batch's slot. A block that recomputes in backward (activation checkpointing) reads inp
// from the set every recomputing block shares, so its inp is copied too. Not under context parallelism (a stage
// replays its forwards, so a slot holds no micro-batch until its W): the pipeline refuses it.
#include "fsdpp/nn/layers.hpp"

#include <cstdint>
#include <vector>

namespace fsdpp {

// Whether a record copies the output gradient: a scratch buffer that the next module's backward reuses (copy), or
// one of the micro-batch's own slot, untouched until W frees it (the head's logits gradient: in_slot).
enum class OutputGradient { copy, in_slot };

class WeightGradientStash {
 public:
  // Linear::weight_gradients(chunks, dout, inp, N, in, out, ld, at) of `owner`'s `linear`, kept for W. Records in
  // the same order every micro-batch, so the k-th record reuses the k-th copy's buffer (allocated once).
  void record(const Module& owner, const Linear& linear, GradientChunks& chunks, const View1<float>& dout,
              const View1<float>& inp, int N, int in, int out, int ld, int at,
              OutputGradient output_gradient = OutputGradient::copy);
  // W for `owner`: the weight gradients it recorded, in their order.
  void compute(const Module& owner);
  // After W: every record computed; the buffers stay for the next micro-batch.
  void finish();
  bool empty() const { return recorded_ == 0; }
  // The floats of output-gradient copies held (each distinct dout once: the projections of one packed qkv share
  // it), allocated by the first micro-batch's records and kept for the next.
  std::int64_t elements() const;

 private:
  struct Record {
    const Module* owner = nullptr;
    Parameter* weight = nullptr;
    Parameter* bias = nullptr;
    GradientChunks* chunks = nullptr;
    View1<float> dout;  // a copy, or the previous record's when they read the same buffer
    View1<float> inp;   // the slot's activation, or a copy (copies_inp) as dout's
    const float* dout_source = nullptr;
    const float* inp_source = nullptr;
    int N = 0, in = 0, out = 0, ld = 0, at = 0;
    bool copies_dout = true, shares_dout = false, copies_inp = false, shares_inp = false;  // shares: the record
                                                                                            // before's copy
    bool pending = false;
  };
  std::vector<Record> records_;
  std::size_t recorded_ = 0;
};

// Linear::weight_gradients now, or, with flow.weight_stash set (zero_bubble's I), recorded for the weight pass.
void linear_weight_gradients(const Flow& flow, const Module& owner, const Linear& linear, GradientChunks& chunks,
                             const View1<float>& dout, const View1<float>& inp, int N, int in, int out, int ld, int at,
                             OutputGradient output_gradient = OutputGradient::copy);
inline void linear_weight_gradients(const Flow& flow, const Module& owner, const Linear& linear, GradientChunks& chunks,
                                    const View1<float>& dout, const View1<float>& inp, int N, int in, int out,
                                    OutputGradient output_gradient = OutputGradient::copy) {
  linear_weight_gradients(flow, owner, linear, chunks, dout, inp, N, in, out, out, 0, output_gradient);
}

}  // namespace fsdpp
