#pragma once
// The rules that tie deck keys together, each written once: a pure function per rule (or per small family of
// rules on the same keys) that throws a DeckRuleError naming the keys involved.
//
//   - parse_deck calls the deck-wide ones on every deck, after the derived defaults are filled, and reports a
//     DeckRuleError at the deck line or override that set one of its keys last ("deck.yaml:4:11: ...");
//   - the code that depends on a rule calls the same function where it depends on it: ParallelDims::resolve
//     (mesh/parallel_dims.hpp, which parallel_layout asks: the strategy and mesh, the job size, the pipeline, cp,
//     ep, the reshard group, in one documented order), fully_shard (the reshard group), the vocabulary
//     split (TensorParallelGroup), the models (shape, tensor and sequence parallelism), DataFeed and the
//     planner (the batch split). A ModelConfig built in code, a test or an import gets the deck's words.
//   - rules that need the launch (the job size, the data-parallel size) run only where that launch is known
//     and used: `fsdpp init` builds a model and never splits a batch, so grad_accum_steps is not its rule.
//
// This header names the deck's structs without including them, so that the layers below the deck (nn, fsdp)
// can call a rule without taking the deck in.
#include "fsdpp/config/deck_enums.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/fixed_point.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp {

struct ModelConfig;
struct TrainConfig;
struct ScheduleConfig;
struct OptimConfig;
struct DataConfig;
struct FsdpConfig;
struct MeshConfig;
struct ActivationCheckpointing;
struct RunConfig;
struct CommConfig;
struct PipelineConfig;

// A broken rule: what() says what is wrong and what to do; keys() are the deck keys the rule ties together
// ("mesh.tp", "model.n_head"), so that parse_deck can point at the one the user set last.
class DeckRuleError : public UsageError {
 public:
  DeckRuleError(std::vector<std::string> keys, const std::string& message);
  const std::vector<std::string>& keys() const { return keys_; }

 private:
  std::vector<std::string> keys_;
};

// ---- the model (model.*) --------------------------------------------------------------------------------
// Every architecture: vocab_size >= 2, positive sizes, n_embd a multiple of n_head. The Llama family (llama,
// qwen2): n_kv_head divides n_head, an even head size (RoPE rotates channel pairs), a positive ffn_hidden,
// rope_theta and norm_eps, and RoPE scaling with factor >= 1 and high_freq_factor > low_freq_factor > 0.
void check_model_shape(const ModelConfig& model);
// model.moe (qwen3_moe, mixtral): top_k <= num_experts, expert_ffn_hidden given, dense_layers in range, some layer sparse.
void check_moe(const ModelConfig& model);

// ---- tensor and sequence parallelism (mesh.tp) ----------------------------------------------------------
// tp > 1 splits whole heads (n_head; and n_kv_head for the Llama family), the MLP width (ffn_hidden for the
// Llama family; GPT-2's 4C follows from n_head) and the vocabulary. Nothing for tp <= 1.
// Mixture-of-experts blocks are not split (each tp rank computes the whole experts' part on the whole rows), so
// not under sequence parallelism, which would route each rank's rows apart.
void check_tensor_parallel(const ModelConfig& model, int tp, bool sequence_parallel = false);
// ---- expert parallelism (mesh.ep) ------------------------------------------------------------------------
// ep >= 1; ep > 1 only for a MoE architecture (is_moe_arch), with model.moe.num_experts a multiple of ep and a
// dp_shard dimension that ep divides (ep is borrowed from it). A dp_shard of -1 (inferred from the job) is
// checked at launch: `shard_ranks` is the resolved dp_shard size, or -1 when not known yet.
void check_expert_parallel(const ModelConfig& model, const MeshConfig& mesh, int shard_ranks);
// ---- context parallelism (mesh.cp) ------------------------------------------------------------------------
// cp >= 1; cp > 1: model.context_length a multiple of 2 cp (two equal chunks per rank), and under sequence
// parallelism the micro-batch's B x T/cp local tokens a multiple of tp; the ring runs the fused attention
// kernels, so model.attention reference or batched is refused (auto is fine); a mesh.dp_shard dimension (the cp
// ranks join its shard group); not with fsdp.strategy no_shard (the cp ranks shard the parameters). With
// train.reproducible, see check_reproducible_chunks.
void check_context_parallel(const ModelConfig& model, const MeshConfig& mesh, const TrainConfig& train,
                            const FsdpConfig& fsdp);
// torch.chunk's split of `vocab_size` rows over tp ranks leaves the last rank some rows.
void check_vocabulary_split(int vocab_size, int tp);
// Under mesh.tp_sequence_parallel a micro-batch's B x T token rows are split over tp: a multiple of tp.
void check_sequence_parallel_tokens(std::int64_t micro_batch, std::int64_t tokens_per_sequence, int tp);

// ---- pipeline parallelism (mesh.pp) ------------------------------------------------------------------------
// pp >= 1. pipeline.virtual_stages > 1 only with interleaved_1f1b; at least one block per stage (model.n_layer >=
// pp x virtual_stages); pipeline.split, when given, names pp x virtual_stages - 1 ascending first blocks in
// 1 .. n_layer - 1; interleaved_1f1b with pipeline.microbatches a multiple of pp (its groups of pp). pipeline.*
// keys set with pp 1 are refused (they would do nothing).
void check_pipeline(const ModelConfig& model, const MeshConfig& mesh, const PipelineConfig& pipeline);
// The micro-batches that flow through the pipeline each step: pipeline.microbatches, or the step's micro-batches
// (`accumulation_steps`) when it is 0; the interleaving rule above on the resolved count.
int pipeline_microbatches(const MeshConfig& mesh, const PipelineConfig& pipeline, int accumulation_steps);
// Stages per rank (virtual_stages > 1) only for interleaved_1f1b.
void check_virtual_stages(PipelineScheduleKind schedule, int virtual_stages);
// The schedules' own needs on m micro-batches: interleaved_1f1b a multiple of pp, zero_bubble at least pp.
// `from_batch`: m came from the step's micro-batches (the message says so).
void check_pipeline_microbatches(PipelineScheduleKind schedule, int pp, int m, bool from_batch);

// ---- strategy and mesh (fsdp.strategy, fsdp.reshard_after_forward, mesh.*) ------------------------------
// At most one of dp_replicate and dp_shard is -1; hybrid_shard needs dp_replicate, full_shard and
// shard_grad_op refuse it; tp_sequence_parallel needs tp > 1; no_shard does not combine with tp;
// reshard_after_forward true or k contradicts shard_grad_op and no_shard; replica_all_reduce last_micro_batch
// needs hybrid_shard with sharded accumulation.
void check_parallel_strategy(const FsdpConfig& fsdp, const MeshConfig& mesh);

// ---- training (train.*, schedule.*) ---------------------------------------------------------------------
// micro_batch <= global_batch and divides it (the split over data-parallel ranks is grad_accum_steps').
void check_batch(const TrainConfig& train);
// train.reproducible: reproducible_unit divides micro_batch; at most kReproducibleMaxUnits units per step (the
// headroom of the fixed-point words, tensor/fixed_point.hpp); reduce_dtype f32 (the exact sum replaces it); no
// replica_all_reduce last_micro_batch (the exact sums are all-reduced once per step anyway).
inline constexpr std::int64_t kReproducibleMaxUnits = GradientWords::kMaxUnits;
void check_reproducible(const TrainConfig& train, const FsdpConfig& fsdp);
// train.reproducible_chunks >= 1; with train.reproducible and more than one chunk: model.context_length a multiple
// of it, a multiple of 2 mesh.cp, model.attention fused (what every cp runs), no MoE architecture and no
// tp_sequence_parallel (not built); reproducible at mesh.cp > 1 needs it (the bits of other cp sizes).
void check_reproducible_chunks(const ModelConfig& model, const MeshConfig& mesh, const TrainConfig& train);
// The token rows of one reproducible chunk, model.context_length / train.reproducible_chunks, or 0 when chunks are
// off (not reproducible, or one chunk): the model's gradient chunks and the GEMM row blocks (tensor/matmul.hpp).
int reproducible_chunk_rows(const ModelConfig& model, const TrainConfig& train);
// Sequences per training forward and backward: train.micro_batch, or in reproducible mode its computation unit,
// train.reproducible_unit (a micro-batch then runs as micro_batch / unit of them, one after another).
int training_forward_batch(const TrainConfig& train);
// The deck key that sets training_forward_batch, for messages that count forwards.
const char* training_forward_batch_key(const TrainConfig& train);
// min_lr <= lr, warmup_steps <= steps.
void check_schedule(const ScheduleConfig& schedule, const OptimConfig& optim, const TrainConfig& train);
// eval_interval > 0 needs held-out data (val_fraction > 0).
void check_evaluation(const TrainConfig& train, const DataConfig& data);
// ---- document masks (data.document_mask, data.reset_positions, data.eot_id) ------------------------------
// What the model's attention and positions respect in packed sequences (docs/models-and-data.md, "Document
// masks"). Off (eot_id -1): plain causal attention, the same bits as before the options existed.
struct DocumentMasks {
  int eot_id = -1;               // the end-of-text id that ends a document; -1: no document masks
  bool reset_positions = false;  // RoPE positions restart at 0 at each document start
  bool enabled() const { return eot_id >= 0; }
};
// document_mask needs eot_id in [0, vocab_size); reset_positions needs document_mask and rotary positions
// (llama, qwen2: GPT-2's learned position table is refused).
void check_document_masks(const DataConfig& data, const ModelConfig& model);
// The one place the deck's options become the model's masks (a corpus index's end-of-text id will be read here).
DocumentMasks document_masks(const DataConfig& data);
// every_<k> names at least one of the model's n_layer blocks.
void check_activation_checkpointing(const ActivationCheckpointing& ac, int n_layer);

// ---- the data (data.*) ---------------------------------------------------------------------------------
// One of data.source and data.sources: with a mixture data.source is empty (the parser clears its default when
// the deck gives data.sources alone).
void check_data_sources(const DataConfig& data);

// ---- the timeline (run.trace) ----------------------------------------------------------------------------
// 1 <= first <= last <= train.steps, and the flight recorder on with comm.flight_records >= 64: the timeline's
// collectives are its records, and a record must still be in the ring when it completes.
void check_trace(const RunConfig& run, const TrainConfig& train, const CommConfig& comm);

// ---- launch time: known only once the job's size is ----------------------------------------------------
// mesh.tp, mesh.tp x mesh.cp and mesh.pp x mesh.cp x mesh.tp divide the job's ranks.
void check_job_size(const MeshConfig& mesh, int world_size);
// fsdp.reshard_after_forward = k (FSDP2's int) divides the ranks of the shard group. k <= 0: unused.
void check_reshard_after_forward_group(int group_size, int shard_ranks);
// Micro-batches each rank runs per optimizer step: global_batch / (micro_batch x dp_size); a DeckRuleError
// when it does not divide. Training's rule (the trainer, the sampler's split, the planner), not building a
// model's or evaluating one's.
int grad_accum_steps(std::int64_t global_batch, std::int64_t micro_batch, int dp_size);
int grad_accum_steps(const TrainConfig& train, int dp_size);

}  // namespace fsdpp
