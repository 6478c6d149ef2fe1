// The rules that tie deck keys together (deck_rules.hpp says who calls them). Each message says what is wrong
// with the values it saw and what to change; parse_deck adds where the deck set the key.
#include "fsdpp/config/deck_rules.hpp"

#include "fsdpp/config/deck.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

namespace fsdpp {
namespace {

constexpr std::int64_t kTraceMinFlightRecords = 64;  // a record stays in the ring until it completes; <= 3 are in flight

template <class... Args>
[[noreturn]] void broken(std::vector<std::string> keys, fmt::format_string<Args...> f, Args&&... args) {
  throw DeckRuleError(std::move(keys), fmt::format(f, std::forward<Args>(args)...));
}

// The rules of Llama's block (RMSNorm, RoPE, grouped-query attention, SwiGLU) on top of the common ones.
void check_llama_family_shape(const ModelConfig& m) {
  if (m.n_kv_head < 1 || m.n_head % m.n_kv_head != 0)
    broken({"model.n_kv_head", "model.n_head"},
           "model.n_kv_head ({}) must divide model.n_head ({}): each key/value head serves n_head / n_kv_head query "
           "heads", m.n_kv_head, m.n_head);
  if (m.head_dim > 0 && m.head_dim % 2 != 0)
    broken({"model.head_dim"}, "model.head_dim ({}) must be even: RoPE rotates channel pairs", m.head_dim);
  if (m.head_dim == 0 && (m.n_embd / m.n_head) % 2 != 0)
    broken({"model.n_embd", "model.n_head"},
           "the head size model.n_embd / model.n_head ({} / {} = {}) must be even: RoPE rotates channel pairs",
           m.n_embd, m.n_head, m.n_embd / m.n_head);
  if (m.ffn_hidden < 1)
    broken({"model.ffn_hidden", "model.ffn_multiplier"}, "model.ffn_hidden ({}) must be at least 1", m.ffn_hidden);
  if (!(m.rope_theta > 0)) broken({"model.rope_theta"}, "model.rope_theta ({}) must be positive", m.rope_theta);
  if (!(m.norm_eps > 0)) broken({"model.norm_eps"}, "model.norm_eps ({}) must be positive", m.norm_eps);
  if (!(m.rope_scaling_factor >= 1))
    broken({"model.rope_scaling_factor"},
           "model.rope_scaling_factor ({}) must be at least 1 (1: plain RoPE; Llama 3.1: 8, Llama 3.2: 32)",
           m.rope_scaling_factor);
  if (m.rope_scaling_factor == 1) return;  // the three below shape the scaling only
  if (!(m.rope_low_freq_factor > 0))
    broken({"model.rope_low_freq_factor"}, "model.rope_low_freq_factor ({}) must be positive (Llama 3.1: 1)",
           m.rope_low_freq_factor);
  if (!(m.rope_high_freq_factor > m.rope_low_freq_factor))
    broken({"model.rope_high_freq_factor", "model.rope_low_freq_factor"},
           "model.rope_high_freq_factor ({}) must exceed model.rope_low_freq_factor ({}) (Llama 3.1: 4 and 1)",
           m.rope_high_freq_factor, m.rope_low_freq_factor);
  if (m.rope_original_context < 1)
    broken({"model.rope_original_context"}, "model.rope_original_context ({}) must be at least 1 (Llama 3.1: 8192)",
           m.rope_original_context);
}

}  // namespace

DeckRuleError::DeckRuleError(std::vector<std::string> keys, const std::string& message)
    : UsageError(message), keys_(std::move(keys)) {}

void check_model_shape(const ModelConfig& m) {
  if (m.vocab_size < 2)
    broken({"model.vocab_size"}, "model.vocab_size ({}) must be at least 2: the model predicts one of its tokens",
           m.vocab_size);
  for (const auto& [key, value] : {std::pair<const char*, int>{"model.context_length", m.context_length},
                                   {"model.n_layer", m.n_layer}, {"model.n_head", m.n_head},
                                   {"model.n_embd", m.n_embd}})
    if (value < 1) broken({key}, "{} ({}) must be at least 1", key, value);
  if (m.head_dim == 0 && m.n_embd % m.n_head != 0)
    broken({"model.n_embd", "model.n_head"}, "model.n_embd ({}) must be a multiple of model.n_head ({})", m.n_embd,
           m.n_head);
  if (is_llama_family(m.arch)) check_llama_family_shape(m);
  if (is_moe_arch(m.arch)) check_moe(m);
}

// model.moe: the experts, the router's top-k, and which layers are sparse.
void check_moe(const ModelConfig& m) {
  const MoeConfig& e = m.moe;
  if (e.top_k > e.num_experts)
    broken({"model.moe.top_k", "model.moe.num_experts"},
           "model.moe.top_k ({}) must be at most model.moe.num_experts ({}): a token goes to top_k different experts",
           e.top_k, e.num_experts);
  if (e.expert_ffn_hidden < 1)
    broken({"model.moe.expert_ffn_hidden", "model.arch"},
           "model.moe.expert_ffn_hidden is required for model.arch {}: each expert's SwiGLU width (HF "
           "moe_intermediate_size; Mixtral's intermediate_size)", to_string(m.arch));
  for (int layer : e.dense_layers)
    if (layer >= m.n_layer)
      broken({"model.moe.dense_layers", "model.n_layer"},
             "model.moe.dense_layers names layer {}, but the model has layers 0 to {} (model.n_layer {})", layer,
             m.n_layer - 1, m.n_layer);
  if (m.arch == ModelArch::mixtral && !e.norm_topk_prob)
    broken({"model.moe.norm_topk_prob", "model.arch"},
           "model.moe.norm_topk_prob is false, but Mixtral's router always renormalises its top-k probabilities: "
           "remove the key, or use model.arch qwen3_moe");
  bool sparse = false;
  for (int l = 0; l < m.n_layer; ++l) sparse = sparse || is_moe_layer(m, l);
  if (!sparse)
    broken({"model.moe.dense_layers", "model.moe.sparse_step"},
           "no layer of this {} model is sparse (model.moe.sparse_step {} and dense_layers leave every layer dense): "
           "use model.arch {} for a dense model", to_string(m.arch), e.sparse_step,
           m.arch == ModelArch::mixtral ? "llama" : "qwen3");
}

void check_tensor_parallel(const ModelConfig& m, int tp, bool sequence_parallel) {
  if (tp <= 1) return;
  if (is_moe_arch(m.arch) && sequence_parallel)
    broken({"mesh.tp_sequence_parallel", "model.arch"},
           "mesh.tp_sequence_parallel with model.arch {}: the mixture-of-experts layers run on every row of each tp "
           "rank (tp splits attention, not the experts), so they cannot take a 1/tp share of the rows; set "
           "mesh.tp_sequence_parallel false", to_string(m.arch));
  if (!is_llama_family(m.arch)) {
    if (m.n_head % tp != 0)  // GPT-2's MLP width 4C then splits too: C is a multiple of n_head
      broken({"mesh.tp", "model.n_head"},
             "mesh.tp ({}) must divide model.n_head ({}): each tensor-parallel rank computes whole attention heads",
             tp, m.n_head);
  } else {
    if (m.n_head % tp != 0 || m.n_kv_head % tp != 0)
      broken({"mesh.tp", "model.n_head", "model.n_kv_head"},
             "mesh.tp ({}) must divide model.n_head ({}) and model.n_kv_head ({}): each tensor-parallel rank computes "
             "whole query and key/value heads", tp, m.n_head, m.n_kv_head);
    bool dense_mlp = false;  // the MLP width splits only in the dense layers
    for (int l = 0; l < m.n_layer; ++l) dense_mlp = dense_mlp || !is_moe_layer(m, l);
    if (dense_mlp && m.ffn_hidden % tp != 0)
      broken({"mesh.tp", "model.ffn_hidden", "model.ffn_multiple_of", "model.ffn_multiplier"},
             "mesh.tp ({}) must divide the MLP width model.ffn_hidden ({}); set model.ffn_hidden (or "
             "model.ffn_multiple_of) to a multiple of {}", tp, m.ffn_hidden, tp);
  }
  check_vocabulary_split(m.vocab_size, tp);
}

void check_expert_parallel(const ModelConfig& m, const MeshConfig& mesh, int shard_ranks) {
  if (mesh.ep < 1) broken({"mesh.ep"}, "mesh.ep ({}) must be at least 1 (1: no expert parallelism)", mesh.ep);
  if (mesh.ep == 1) return;
  if (!is_moe_arch(m.arch))
    broken({"mesh.ep", "model.arch"},
           "mesh.ep ({}) splits the experts of a mixture-of-experts model, but model.arch {} has none: use qwen3_moe "
           "or mixtral, or remove mesh.ep", mesh.ep, to_string(m.arch));
  if (m.moe.num_experts % mesh.ep != 0)
    broken({"mesh.ep", "model.moe.num_experts"},
           "mesh.ep ({}) must divide model.moe.num_experts ({}): each expert-parallel rank holds the same number of "
           "whole experts", mesh.ep, m.moe.num_experts);
  if (mesh.dp_shard == 0)
    broken({"mesh.ep", "mesh.dp_shard"},
           "mesh.ep ({}) is taken from the mesh.dp_shard dimension, which this mesh lacks: set mesh.dp_shard to a "
           "multiple of {} (or -1)", mesh.ep, mesh.ep);
  if (shard_ranks > 0 && shard_ranks % mesh.ep != 0)
    broken({"mesh.ep", "mesh.dp_shard"},
           "mesh.ep ({}) must divide mesh.dp_shard ({}): expert parallelism splits the shard group into "
           "dp_shard / ep groups of ep consecutive ranks", mesh.ep, shard_ranks);
}

void check_context_parallel(const ModelConfig& m, const MeshConfig& mesh, const TrainConfig& train,
                            const FsdpConfig& fsdp) {
  const int cp = mesh.cp;
  if (cp < 1) broken({"mesh.cp"}, "mesh.cp ({}) must be at least 1 (1: no context parallelism)", cp);
  if (cp == 1) return;
  if (m.context_length % (2 * cp) != 0)
    broken({"mesh.cp", "model.context_length"},
           "mesh.cp ({}) cuts each sequence into 2 x {} = {} equal chunks (rank r holds chunks r and {} - r): "
           "model.context_length ({}) must be a multiple of {}", cp, cp, 2 * cp, 2 * cp - 1, m.context_length, 2 * cp);
  if (mesh.tp > 1 && mesh.tp_sequence_parallel &&
      (std::int64_t{training_forward_batch(train)} * (m.context_length / cp)) % mesh.tp != 0)
    broken({"mesh.tp_sequence_parallel", "mesh.cp", "model.context_length", "train.micro_batch"},
           "mesh.tp_sequence_parallel splits each cp rank's train.micro_batch x model.context_length / mesh.cp = {} x "
           "{} tokens over mesh.tp = {} ranks: make it a multiple of {}", training_forward_batch(train),
           m.context_length / cp, mesh.tp, mesh.tp);
  if (m.attention == AttentionKind::reference || m.attention == AttentionKind::batched)
    broken({"mesh.cp", "model.attention"},
           "mesh.cp ({}) runs ring attention on the fused kernels, which never hold a T x T matrix; model.attention "
           "{} would: set model.attention fused (or auto)", cp, to_string(m.attention));
  if (mesh.dp_shard == 0)
    broken({"mesh.cp", "mesh.dp_shard"},
           "mesh.cp ({}): the cp ranks join the mesh.dp_shard dimension's shard group (dp_shard x cp), which this mesh "
           "lacks: set mesh.dp_shard (1, or -1 for the ranks left over)", cp);
  if (fsdp.strategy == ShardStrategy::no_shard)
    broken({"mesh.cp", "fsdp.strategy"},
           "mesh.cp ({}): the cp ranks hold the same parameters and join the shard group (dp_shard x cp), which "
           "fsdp.strategy no_shard does not have: use full_shard, shard_grad_op or hybrid_shard", cp);
}

void check_vocabulary_split(int vocab_size, int tp) {
  // torch.chunk: ceil(V / tp) rows per rank, so the trailing ranks may get fewer rows, or none.
  const std::int64_t per_rank = (std::int64_t{vocab_size} + tp - 1) / tp;
  if (std::int64_t{tp - 1} * per_rank >= vocab_size)
    broken({"mesh.tp", "model.vocab_size"},
           "mesh.tp ({}) splits model.vocab_size ({}) like torch.chunk, which leaves the last tensor-parallel rank no "
           "vocabulary rows; use a smaller mesh.tp", tp, vocab_size);
}

void check_sequence_parallel_tokens(std::int64_t micro_batch, std::int64_t tokens_per_sequence, int tp) {
  const std::int64_t tokens = micro_batch * tokens_per_sequence;
  if (tp > 1 && tokens % tp != 0)
    broken({"mesh.tp_sequence_parallel", "mesh.tp", "train.micro_batch", "model.context_length"},
           "mesh.tp_sequence_parallel splits a micro-batch's train.micro_batch x model.context_length = {} x {} = {} "
           "tokens over mesh.tp = {} ranks: make it a multiple of {}", micro_batch, tokens_per_sequence, tokens, tp,
           tp);
}

void check_parallel_strategy(const FsdpConfig& fsdp, const MeshConfig& mesh) {
  if (mesh.dp_replicate == -1 && mesh.dp_shard == -1)
    broken({"mesh.dp_replicate", "mesh.dp_shard"},
           "mesh.dp_replicate and mesh.dp_shard are both -1, but only one size can be inferred from the job size "
           "(mesh.dp_shard is -1 unless set)");
  const bool replicas = mesh.dp_replicate != 0;
  if (fsdp.strategy == ShardStrategy::hybrid_shard && !replicas)
    broken({"fsdp.strategy", "mesh.dp_replicate"},
           "fsdp.strategy hybrid_shard needs a mesh.dp_replicate dimension, e.g. mesh: {{dp_replicate: 2, dp_shard: "
           "-1}}");
  if ((fsdp.strategy == ShardStrategy::full_shard || fsdp.strategy == ShardStrategy::shard_grad_op) && replicas)
    broken({"mesh.dp_replicate", "fsdp.strategy"},
           "mesh.dp_replicate ({}) makes a 2-D mesh, which fsdp.strategy {} does not use: set fsdp.strategy "
           "hybrid_shard, or remove mesh.dp_replicate", mesh.dp_replicate, to_string(fsdp.strategy));
  if (mesh.tp_sequence_parallel && mesh.tp == 1)
    broken({"mesh.tp_sequence_parallel", "mesh.tp"},
           "mesh.tp_sequence_parallel splits tokens over the tensor-parallel ranks, but mesh.tp is 1: set mesh.tp > 1, "
           "or remove mesh.tp_sequence_parallel");
  if (mesh.tp > 1 && fsdp.strategy == ShardStrategy::no_shard)
    broken({"mesh.tp", "fsdp.strategy"},
           "fsdp.strategy no_shard lays its own mesh over every rank; combine mesh.tp with full_shard, shard_grad_op "
           "or hybrid_shard");
  const auto reshard = fsdp.reshard_after_forward.kind;
  const bool reshards = reshard == ReshardAfterForward::Kind::yes || reshard == ReshardAfterForward::Kind::group;
  if (reshards && (fsdp.strategy == ShardStrategy::shard_grad_op || fsdp.strategy == ShardStrategy::no_shard))
    broken({"fsdp.strategy", "fsdp.reshard_after_forward"},
           "fsdp.reshard_after_forward ({}) contradicts fsdp.strategy {}, which keeps parameters unsharded after "
           "forward; leave it auto or set false", to_string(fsdp.reshard_after_forward), to_string(fsdp.strategy));
  if (fsdp.replica_all_reduce == ReplicaAllReduce::last_micro_batch && fsdp.strategy != ShardStrategy::hybrid_shard)
    broken({"fsdp.replica_all_reduce", "fsdp.strategy"},
           "fsdp.replica_all_reduce last_micro_batch defers hybrid_shard's all-reduce over the replicas, but "
           "fsdp.strategy {} has none to defer: set fsdp.strategy hybrid_shard, or remove fsdp.replica_all_reduce",
           to_string(fsdp.strategy));
  if (fsdp.replica_all_reduce == ReplicaAllReduce::last_micro_batch && fsdp.accumulate == GradAccumulation::unsharded)
    broken({"fsdp.replica_all_reduce", "fsdp.accumulate"},
           "fsdp.replica_all_reduce last_micro_batch defers the replica all-reduce of sharded accumulation, but "
           "fsdp.accumulate unsharded already reduces once per step: remove one of the two");
}

void check_batch(const TrainConfig& train) {
  if (train.micro_batch > train.global_batch)
    broken({"train.micro_batch", "train.global_batch"}, "train.micro_batch ({}) must be <= train.global_batch ({})",
           train.micro_batch, train.global_batch);
  if (train.global_batch % train.micro_batch != 0)
    broken({"train.micro_batch", "train.global_batch"},
           "train.global_batch ({}) must be a multiple of train.micro_batch ({})", train.global_batch,
           train.micro_batch);
}

void check_reproducible(const TrainConfig& train, const FsdpConfig& fsdp) {
  if (!train.reproducible) return;
  if (train.micro_batch % train.reproducible_unit != 0)
    broken({"train.reproducible_unit", "train.micro_batch"},
           "train.reproducible runs each micro-batch as units of train.reproducible_unit ({}) sequences, which must "
           "divide train.micro_batch ({}): choose a unit that divides the micro-batch of every layout you run on "
           "(1 always does)", train.reproducible_unit, train.micro_batch);
  if (train.global_batch / train.reproducible_unit > kReproducibleMaxUnits)
    broken({"train.reproducible_unit", "train.global_batch"},
           "train.reproducible sums at most {} units per step exactly, but train.global_batch {} / "
           "train.reproducible_unit {} makes {}: raise train.reproducible_unit", kReproducibleMaxUnits,
           train.global_batch, train.reproducible_unit, train.global_batch / train.reproducible_unit);
  if (fsdp.reduce_dtype != DType::f32)
    broken({"train.reproducible", "fsdp.reduce_dtype"},
           "train.reproducible sums gradients exactly in fixed point, which replaces fsdp.reduce_dtype; a bf16 "
           "reduction would round each unit's gradient differently from the default: set fsdp.reduce_dtype f32, or "
           "train.reproducible false");
  if (fsdp.replica_all_reduce == ReplicaAllReduce::last_micro_batch)
    broken({"train.reproducible", "fsdp.replica_all_reduce"},
           "train.reproducible already all-reduces the step's exact gradient sums over the replicas once, after the "
           "last micro-batch: remove fsdp.replica_all_reduce");
}

void check_reproducible_chunks(const ModelConfig& m, const MeshConfig& mesh, const TrainConfig& train) {
  const int chunks = train.reproducible_chunks;
  if (chunks < 1) broken({"train.reproducible_chunks"}, "train.reproducible_chunks ({}) must be at least 1", chunks);
  if (!train.reproducible) return;
  if (chunks == 1 && mesh.cp > 1)
    broken({"mesh.cp", "train.reproducible", "train.reproducible_chunks"},
           "mesh.cp ({}) with train.reproducible needs train.reproducible_chunks: each rank holds 2 of 2 x {} chunks "
           "of a sequence, and its bits match other cp sizes only when products and weight-gradient sums run on "
           "fixed token chunks. Set train.reproducible_chunks to a multiple of {}, the same on every run you compare "
           "(8 covers mesh.cp 1, 2 and 4)", mesh.cp, mesh.cp, 2 * mesh.cp);
  if (chunks == 1) return;
  if (m.context_length % chunks != 0)
    broken({"train.reproducible_chunks", "model.context_length"},
           "train.reproducible_chunks ({}) cuts each sequence into equal chunks: model.context_length ({}) must be a "
           "multiple of it", chunks, m.context_length);
  if (mesh.cp > 1 && chunks % (2 * mesh.cp) != 0)
    broken({"train.reproducible_chunks", "mesh.cp"},
           "train.reproducible_chunks ({}) must be a multiple of 2 x mesh.cp = {}: each cp rank holds 2 of 2 x {} "
           "equal parts of a sequence, and each part must be whole chunks", chunks, 2 * mesh.cp, mesh.cp);
  if (m.attention != AttentionKind::fused)
    broken({"train.reproducible_chunks", "model.attention"},
           "train.reproducible_chunks ({}) compares runs across mesh.cp, which always runs the fused attention "
           "kernels: set model.attention fused on every run (it is {})", chunks, to_string(m.attention));
  if (is_moe_arch(m.arch))
    broken({"train.reproducible_chunks", "model.arch"},
           "train.reproducible_chunks ({}) is not built for mixtures of experts ({}): their expert products and "
           "balancing losses are not yet cut into token chunks. Use train.reproducible_chunks 1 (bitwise across "
           "data-parallel layouts at mesh.cp 1)", chunks, to_string(m.arch));
  if (mesh.tp > 1 && mesh.tp_sequence_parallel)
    broken({"train.reproducible_chunks", "mesh.tp_sequence_parallel"},
           "train.reproducible_chunks ({}) with mesh.tp_sequence_parallel: the norms' weight gradients are summed "
           "over the tp ranks' rows in floating point, which the exact chunk sums cannot follow; drop "
           "mesh.tp_sequence_parallel (tensor parallelism without it is fine)", chunks);
}

int reproducible_chunk_rows(const ModelConfig& m, const TrainConfig& train) {
  return train.reproducible && train.reproducible_chunks > 1 ? m.context_length / train.reproducible_chunks : 0;
}

int training_forward_batch(const TrainConfig& train) {
  return train.reproducible ? train.reproducible_unit : train.micro_batch;
}

const char* training_forward_batch_key(const TrainConfig& train) {
  return train.reproducible ? "train.reproducible_unit" : "train.micro_batch";
}

void check_schedule(const ScheduleConfig& schedule, const OptimConfig& optim, const TrainConfig& train) {
  if (schedule.min_lr > optim.lr)
    broken({"schedule.min_lr", "optim.lr"}, "schedule.min_lr ({}) must be <= optim.lr ({})", schedule.min_lr,
           optim.lr);
  if (schedule.warmup_steps > train.steps)
    broken({"schedule.warmup_steps", "train.steps"}, "schedule.warmup_steps ({}) must be <= train.steps ({})",
           schedule.warmup_steps, train.steps);
}

void check_evaluation(const TrainConfig& train, const DataConfig& data) {
  if (train.eval_interval > 0 && data.val_fraction == 0.0)
    broken({"train.eval_interval", "data.val_fraction"},
           "train.eval_interval ({}) needs held-out data: set data.val_fraction > 0, or train.eval_interval: 0",
           train.eval_interval);
}

void check_document_masks(const DataConfig& data, const ModelConfig& model) {
  if (data.document_mask && data.eot_id < 0)
    broken({"data.document_mask", "data.eot_id"},
           "data.document_mask needs the end-of-text id that ends each document: set data.eot_id (GPT-2's "
           "tokenizer: 50256)");
  if (data.eot_id >= model.vocab_size)
    broken({"data.eot_id", "model.vocab_size"}, "data.eot_id ({}) must be below model.vocab_size ({})", data.eot_id,
           model.vocab_size);
  if (data.reset_positions && !data.document_mask)
    broken({"data.reset_positions", "data.document_mask"},
           "data.reset_positions restarts positions at document starts, which only data.document_mask defines "
           "(without it a document would see the one before at shifted positions): set data.document_mask: true "
           "or remove data.reset_positions");
  if (data.reset_positions && !is_llama_family(model.arch))
    broken({"data.reset_positions", "model.arch"},
           "data.reset_positions is for rotary positions (model.arch llama or qwen2); {} adds a learned position "
           "table, which fsdpp does not reset: remove data.reset_positions",
           to_string(model.arch));
}

DocumentMasks document_masks(const DataConfig& data) {
  DocumentMasks masks;
  if (!data.document_mask) return masks;
  masks.eot_id = static_cast<int>(data.eot_id);
  masks.reset_positions = data.reset_positions;
  return masks;
}

void check_data_sources(const DataConfig& data) {
  if (!data.sources.empty() && !data.source.empty())
    broken({"data.source", "data.sources"},
           "data.source ({}) and data.sources are both given: a run trains on one source or on a mixture; remove "
           "data.source to train on the mixture, or data.sources to train on {} alone", data.source, data.source);
  if (data.sources.empty() && data.source.empty())
    broken({"data.source"}, "no training data: set data.source (a token file, a corpus folder or 'synthetic') or "
                            "data.sources (a weighted list of them)");
}

void check_trace(const RunConfig& run, const TrainConfig& train, const CommConfig& comm) {
  if (run.trace_first == 0) return;
  const std::string steps = run.trace_first == run.trace_last ? fmt::format("{}", run.trace_first)
                                                              : fmt::format("{}-{}", run.trace_first, run.trace_last);
  if (run.trace_first > run.trace_last)
    broken({"run.trace"}, "run.trace {} ends before it starts: write <first>-<last> with first <= last, e.g. {}-{}",
           steps, run.trace_last, run.trace_first);
  if (run.trace_last > train.steps)
    broken({"run.trace", "train.steps"}, "run.trace {} goes past the last step (train.steps {}): trace steps 1-{} "
           "at most", steps, train.steps, train.steps);
  if (comm.flight_records < kTraceMinFlightRecords)
    broken({"run.trace", "comm.flight_records"}, "run.trace {} takes its collectives from the flight recorder, but "
           "comm.flight_records is {}: set comm.flight_records >= {} (the default is 4096)", steps,
           comm.flight_records, kTraceMinFlightRecords);
}

void check_activation_checkpointing(const ActivationCheckpointing& ac, int n_layer) {
  if (ac.kind == ActivationCheckpointing::Kind::every && ac.every > n_layer)
    broken({"train.activation_checkpointing", "model.n_layer"},
           "train.activation_checkpointing every_{} checkpoints blocks h.{}, h.{}, ..., but the model has only {} "
           "(model.n_layer): none would be; use every_<k> with k <= {}, or full", ac.every, ac.every - 1,
           2 * ac.every - 1, n_layer, n_layer);
}

void check_pipeline(const ModelConfig& m, const MeshConfig& mesh, const PipelineConfig& p) {
  if (mesh.pp < 1) broken({"mesh.pp"}, "mesh.pp ({}) must be at least 1", mesh.pp);
  if (mesh.pp == 1) {
    if (p.virtual_stages != 1 || !p.split.empty() || p.microbatches != 0)
      broken({"pipeline.virtual_stages", "pipeline.split", "pipeline.microbatches", "mesh.pp"},
             "pipeline.* is set but mesh.pp is 1 (no pipeline): set mesh.pp > 1, or remove the pipeline keys");
    return;
  }
  check_virtual_stages(p.schedule, p.virtual_stages);
  const int stages = mesh.pp * p.virtual_stages;
  if (m.n_layer < stages)
    broken({"mesh.pp", "pipeline.virtual_stages", "model.n_layer"},
           "the pipeline has mesh.pp x pipeline.virtual_stages = {} x {} = {} stages but the model only {} blocks "
           "(model.n_layer): every stage needs at least one; lower mesh.pp or pipeline.virtual_stages",
           mesh.pp, p.virtual_stages, stages, m.n_layer);
  if (!p.split.empty()) {
    if (static_cast<int>(p.split.size()) != stages - 1)
      broken({"pipeline.split", "mesh.pp", "pipeline.virtual_stages"},
             "pipeline.split names {} first block(s), but {} stages need {} (the first block of every stage after "
             "the first)", p.split.size(), stages, stages - 1);
    int previous = 0;
    for (int first : p.split) {
      if (first <= previous || first >= m.n_layer)
        broken({"pipeline.split", "model.n_layer"},
               "pipeline.split [{}] must rise from 1 to at most model.n_layer - 1 = {}, each stage keeping at least "
               "one block; {} breaks that", fmt::join(p.split, ", "), m.n_layer - 1, first);
      previous = first;
    }
  }
  if (p.microbatches > 0) (void)pipeline_microbatches(mesh, p, p.microbatches);
}

void check_virtual_stages(PipelineScheduleKind schedule, int virtual_stages) {
  if (virtual_stages > 1 && schedule != PipelineScheduleKind::interleaved_1f1b)
    broken({"pipeline.virtual_stages", "pipeline.schedule"},
           "pipeline.virtual_stages {} needs pipeline.schedule: interleaved_1f1b ({} runs one stage per rank)",
           virtual_stages, to_string(schedule));
}

void check_pipeline_microbatches(PipelineScheduleKind schedule, int pp, int m, bool from_batch) {
  const char* whence = from_batch ? " (the step's micro-batches, as pipeline.microbatches is 0)" : "";
  if (schedule == PipelineScheduleKind::interleaved_1f1b && m % pp != 0)
    broken({"pipeline.microbatches", "mesh.pp", "pipeline.schedule"},
           "pipeline.schedule interleaved_1f1b runs the micro-batches in groups of mesh.pp = {}, but there are {}{}: "
           "make pipeline.microbatches a multiple of {}", pp, m, whence, pp);
  if (schedule == PipelineScheduleKind::zero_bubble && m < pp)
    broken({"pipeline.microbatches", "mesh.pp", "pipeline.schedule"},
           "pipeline.schedule zero_bubble needs at least mesh.pp = {} micro-batches, but there are {}{}: raise "
           "pipeline.microbatches", pp, m, whence);
}

int pipeline_microbatches(const MeshConfig& mesh, const PipelineConfig& p, int accumulation_steps) {
  const int m = p.microbatches > 0 ? p.microbatches : accumulation_steps;
  check_pipeline_microbatches(p.schedule, mesh.pp, m, p.microbatches == 0);
  return m;
}

void check_job_size(const MeshConfig& mesh, int world_size) {
  if (world_size % mesh.tp != 0)
    broken({"mesh.tp"}, "mesh.tp is {}, which does not divide the {} ranks of the job: launch a multiple of {} ranks, "
           "or change mesh.tp", mesh.tp, world_size, mesh.tp);
  if (world_size % (mesh.tp * mesh.cp) != 0)
    broken({"mesh.cp", "mesh.tp"},
           "mesh.cp x mesh.tp is {} x {} = {}, which does not divide the {} ranks of the job: launch a multiple of {} "
           "ranks, or change mesh.cp", mesh.cp, mesh.tp, mesh.cp * mesh.tp, world_size, mesh.cp * mesh.tp);
  const int per_stage = mesh.cp * mesh.tp;
  if (world_size % (mesh.pp * per_stage) != 0)
    broken({"mesh.pp"},
           "mesh.pp x mesh.cp x mesh.tp is {} x {} x {} = {}, which does not divide the {} ranks of the job: launch a "
           "multiple of {} ranks, or change mesh.pp", mesh.pp, mesh.cp, mesh.tp, mesh.pp * per_stage, world_size,
           mesh.pp * per_stage);
}

void check_reshard_after_forward_group(int group_size, int shard_ranks) {
  if (group_size > 0 && shard_ranks % group_size != 0)
    broken({"fsdp.reshard_after_forward", "mesh.dp_shard"},
           "fsdp.reshard_after_forward = {} must divide the {} ranks of the shard group", group_size, shard_ranks);
}

int grad_accum_steps(std::int64_t global_batch, std::int64_t micro_batch, int dp_size) {
  FSDPP_CHECK(dp_size >= 1, "grad_accum_steps: data-parallel size must be >= 1, got {}", dp_size);
  if (global_batch < 1 || micro_batch < 1)
    broken({"train.global_batch", "train.micro_batch"},
           "train.global_batch ({}) and train.micro_batch ({}) must be at least 1", global_batch, micro_batch);
  const std::int64_t per_pass = micro_batch * dp_size;
  if (global_batch % per_pass != 0)
    broken({"train.global_batch", "train.micro_batch"},
           "train.global_batch ({}) must be a multiple of train.micro_batch ({}) x {} data-parallel ranks = {}; change "
           "train.global_batch or train.micro_batch, or the number of ranks", global_batch, micro_batch, dp_size,
           per_pass);
  return static_cast<int>(global_batch / per_pass);
}

int grad_accum_steps(const TrainConfig& train, int dp_size) {
  return grad_accum_steps(train.global_batch, train.micro_batch, dp_size);
}

}  // namespace fsdpp
