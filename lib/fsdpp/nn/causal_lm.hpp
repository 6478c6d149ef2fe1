#pragma once
// CausalLM: what every decoder-only language model here shares around its blocks:
//
//   tokens -> token embedding (+ a learned position table) -> blocks -> final norm -> logits = x E^T -> cross-entropy
//
// with the vocabulary-parallel embedding, head and loss of tensor parallelism, sequence parallelism's gathers,
// the block loop (each block a Module: fully_shard's unit, with its hooks and activation checkpointing), the
// buffers the blocks share (decoder_block.hpp) and the head's own, all declared in tables that both allocate them
// and count them for `fsdpp plan`.
//
// A model (gpt.hpp, llama.hpp, qwen2.hpp, qwen3.hpp, mixtral.hpp) derives from it: it names the embedding, the position table (if any)
// and the final norm in an LmLayout, says how positions enter (a learned table, or RoPE in the blocks), adds its
// blocks with add_blocks, and describes itself. Its one immutable ModelConfig is the deck's; tensor-parallel
// shapes come from the tensor-parallel group (TensorParallelGroup), never from a copy of the config.
//
// Dimensions: B batch, T sequence, N = B*T rows, C channels, V vocabulary (Vl this rank's rows of it under tensor
// parallelism), L blocks; Nl = N/tp rows of the residual stream under sequence parallelism (N otherwise).
#include "fsdpp/config/deck.hpp"
#include "fsdpp/nn/context_parallel.hpp"
#include "fsdpp/nn/decoder_block.hpp"
#include "fsdpp/nn/kv_cache.hpp"
#include "fsdpp/nn/language_model.hpp"
#include "fsdpp/nn/layers.hpp"

#include <array>
#include <memory>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>

namespace fsdpp {

// What a model names and chooses at the model level, in the order its parameters are registered: the token
// embedding, the position table (if any), the final norm, the LM head (unless tied), then the blocks.
struct LmLayout {
  std::string type_name;       // the root module's: "GPT", "Llama", "Qwen2"
  std::string embedding;       // (V, C): "wte.weight", "embed_tokens.weight"
  std::string position_table;  // (context_length, C) learned positions, or "" for RoPE in the blocks
  std::string final_norm;      // "ln_f", "norm"
  NormKind norm = NormKind::layer_norm;
  std::string block_prefix;    // blocks are "<prefix><l>": "h.", "layers."
};

class CausalLM : public LanguageModel {
 public:
  // UsageError naming the deck key when `config` is not a model of architecture `arch` or its shape is impossible
  // (models call it before they compute any shape).
  static void require_shape(const ModelConfig& config, ModelArch arch);

  const ModelConfig& config() const { return config_; }
  const LmLayout& layout() const { return layout_; }
  // The blocks as the model's own block type.
  template <class Block> std::vector<Block*> blocks_as() const {
    std::vector<Block*> out;
    for (const auto& b : blocks_) out.push_back(static_cast<Block*>(b.get()));
    return out;
  }

  Parameter& token_embedding;  // (V, C)
  Parameter* position_table;   // (context_length, C), or nullptr
  Norm final_norm;             // (C)
  Parameter* lm_head;          // (V, C), or nullptr when tied (the token embedding serves)

  // LanguageModel
  std::vector<Module*> block_modules() const override;
  View1<float> losses() const override { return head_.losses; }
  // (N, Vl) logits of the last evaluation forward (a training forward leaves d(loss)/d(logits) there instead).
  View1<float> logits() const { return head_.logits; }
  std::int64_t activation_bytes() const override;
  ActivationSplit activation_split(int B, int T, int recomputing_blocks = 0) const override;
  void set_document_masks(const DocumentMasks& masks) override;
  std::int64_t parameter_count() const override;
  FlopsByPiece flops_per_token_by_piece(int T) const override;
  int vocab_size() const override { return config_.vocab_size; }
  int context_length() const override { return config_.context_length; }
  void apply_tensor_parallel(std::shared_ptr<TensorParallelGroup> tp) override;
  TensorParallelGroup& tensor_parallel() override { return *context_->tp; }
  std::vector<Module*> apply_expert_parallel(std::shared_ptr<ExpertParallelGroup> ep, bool per_source = false) override;
  void apply_context_parallel(std::shared_ptr<ContextParallelGroup> cp) override;
  void apply_reproducible_chunks(int rows) override;
  void keep_pipeline_stage(const PipelineStagePart& part) override;
  std::size_t residual_elements(int B, int T) const override;
  std::int64_t weight_stash_elements(int B, int T) const override;
  const ContextParallelStats* context_parallel_stats() const override {
    return context_->cp->active() ? &context_->cp->stats() : nullptr;
  }

  // Decoding (kv_cache.hpp): a cache for `sequences` of up to `capacity` positions (at most context_length); what
  // it takes, and what a decode forward of up to `rows` rows adds, from their tables (`fsdpp plan --generate`).
  KvCache make_kv_cache(int sequences, int capacity) const;
  std::int64_t kv_cache_bytes_for(int sequences, int capacity) const;
  std::int64_t decode_buffer_bytes_for(int sequences, int capacity, int rows) const;

 protected:
  // On "meta": shapes and init rules only, no storage. `dims`: the blocks' (for the RoPE head size).
  CausalLM(const ModelConfig& config, LmLayout layout, const BlockDims& dims);
  // L blocks of type Block, each built as Block(config, dims, context), under "<block_prefix><l>".
  // A Block constructible with the layer index as a fourth argument gets it (sparse or dense: is_moe_layer).
  template <class Block> void add_blocks() {
    for (int l = 0; l < config_.n_layer; ++l) {
      if constexpr (std::is_constructible_v<Block, const ModelConfig&, const BlockDims&, std::shared_ptr<BlockContext>, int>)
        blocks_.push_back(std::make_unique<Block>(config_, dims_, context_, l));
      else
        blocks_.push_back(std::make_unique<Block>(config_, dims_, context_));
      blocks_.back()->index_ = l;
      add_child(*blocks_.back(), layout_.block_prefix + std::to_string(l));
    }
    number_sparse_blocks();
  }
  void forward(Flow& flow) override;
  void backward(Flow& flow) override;
  void backward_weight(Flow& flow) override;  // the head's (on the last stage), then the selected chunk's blocks'

 public:
  // Mixture-of-experts models: the router's statistics of the last training forward (nullptr for dense models).
  const RouterStatistics* router_statistics() const override { return context_->router.get(); }
  RouterStatistics* router_statistics() override { return context_->router.get(); }
  void finish_router_statistics(float loss_scale) override;
  // Its router statistics are its pipeline payload (RouterStatistics::state); none for dense models.
  std::size_t pipeline_payload_size() const override;
  void write_pipeline_payload(std::vector<double>& out) const override;
  void read_forward_payload(const std::vector<double>& in) override;
  void read_backward_payload(const std::vector<double>& in, float loss_scale) override;
  void add_routing_totals(RoutingTotals& totals) const override;
  void balance_expert_load(const std::vector<double>& tokens) override;

 private:
  void number_sparse_blocks();
  int recomputing_blocks_now() const;
  std::array<std::int64_t, 2> chunk_scratch_elements() const;
  std::int64_t chunk_scratch_bytes() const;  // reproducible chunks' gradient scratch, while they are on  // after add_blocks: each sparse block's index among them, and the statistics
  struct Head {  // the model's own buffers (see head_table)
    View1<float> x0, lnf, logits, losses, dlnf, dx, dlnf_local, norm_grads, ce_stats;
    NormStats lnf_stats;
    View1<std::int32_t> local_tokens;
    View1<std::int32_t> document_starts;
    ContextParallelGroup::LocalRows cp_rows;  // context parallelism: this rank's rows of the sequences
  };
  BufferTable head_table(Head& h, int B, int T, int chunk) const;  // the buffers of pipeline chunk `chunk`
  struct DecodeHead {  // the decode forward's own buffers: each sequence's last row through the norm and the head
    View1<float> last, lnf, logits;
    NormStats lnf_stats;
    View1<std::int32_t> local_tokens;
  };
  BufferTable decode_head_table(DecodeHead& h, int N, int S) const;
  void decode_forward(Flow& flow);
  Parameter& head() const { return lm_head ? *lm_head : token_embedding; }
  void localize_sequences(Flow& flow);
  void use_local_rows(Flow& flow);  // the flow and the blocks on the rows localize_sequences made
  void attend_on_local_rows();      // the blocks' positions and document starts, the ring's rows: head_.cp_rows
  void embed(const Flow& flow, int N);
  void embed_backward(const Flow& flow, const View1<float>& dx, int N);
  void head_backward(Flow& flow, int N, int Nl);

  const ModelConfig config_;
  const LmLayout layout_;
  const BlockDims dims_;
  DocumentMasks masks_;
  std::shared_ptr<BlockContext> context_;
  std::vector<std::unique_ptr<DecoderBlock>> blocks_;
  Head head_;
  Buffers head_buffers_{Growth::exact};
  DecodeHead decode_head_;
  Buffers decode_head_buffers_{Growth::grow_only};
  View1<float> final_x_;  // (Nl,C) alias of the last block's output
  // Activation slots (module.hpp): the head's buffers of the micro-batches not computed now.
  struct SlotState {
    Head head;
    Buffers buffers{Growth::exact};
    View1<float> final_x;
  };
  SlotStates<SlotState> slots_;
  void swap_activation_slot(int from, int to) override;
  // Pipeline chunks (keep_pipeline_stage): chunk c runs blocks_[chunk_begin_[c] .. chunk_begin_[c + 1]); empty for
  // the whole model, one chunk of every block.
  std::vector<std::size_t> chunk_begin_;
  std::pair<std::size_t, std::size_t> chunk_blocks() const;  // the selected chunk's
  bool runs_child(const Module& child) const override;
};

}  // namespace fsdpp
