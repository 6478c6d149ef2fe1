// The deck's key table. Each entry binds a key path to a Deck member with its type, allowed range and meaning;
// defaults are the members' in-class initializers, so they are written once. Later issues add keys here.
#include "fsdpp/config/deck_field_kinds.hpp"

#include <yaml-cpp/yaml.h>

#include <iterator>

namespace fsdpp::deck_detail {
namespace {

std::vector<Field> run_fields() {
  std::vector<Field> f;
  f.push_back(text("run.name", &Deck::run, &RunConfig::name, "Name of the run; names the output folder.", true));
  f.back().default_doc = "<deck file name without extension>";
  f.push_back(integer("run.seed", &Deck::run, &RunConfig::seed, 0,
                      "Seed for initialization, data sampling and the synthetic corpus."));
  f.push_back(text("run.output", &Deck::run, &RunConfig::output,
                   "Folder for the log copy, the resolved deck and metrics.jsonl."));
  f.back().default_doc = "runs/<run.name>";
  f.push_back(trace_steps());
  f.push_back(text("run.machine", &Deck::run, &RunConfig::machine,
                   "A machine preset (fsdpp plan --list-machines: a100-sxm-8x, h100-sxm-8x, h200-sxm-8x) or a machine "
                   "YAML file (fsdpp bench calibrate > machine.yaml): the end of the run prints the step time fsdpp "
                   "plan --machine predicts beside the measured one (docs/performance-model.md)."));
  f.back().type = "<preset|file.yaml>";
  f.back().default_doc = "none (no prediction)";
  f.back().get = [](const Deck& d) { return d.run.machine.empty() ? std::string() : yaml_scalar(d.run.machine); };
  return f;
}

std::vector<Field> model_fields() {
  std::vector<Field> f;
  f.push_back(choice("model.arch", &Deck::model, &ModelConfig::arch, kArchs,
                     "gpt2: GPT-2 (LayerNorm, learned positions, GELU MLP, biases); llama: Llama 2/3 (RMSNorm, "
                     "RoPE, grouped-query attention, SwiGLU MLP, no biases, untied lm_head unless "
                     "model.tie_embeddings is set); qwen2: Qwen2 / Qwen2.5 (Llama's block plus q/k/v biases; "
                     "rope_theta 1e6 and norm_eps 1e-6 unless set); qwen3: Qwen3 (Llama's block plus per-head "
                     "q/k RMSNorm, model.head_dim; Qwen's defaults); qwen3_moe: Qwen3-MoE (Qwen3's attention, "
                     "model.moe's mixture-of-experts MLPs); mixtral: Mixtral (Llama's attention, model.moe's "
                     "MLPs, rope_theta 1e6). The model.* keys marked 'llama only' apply to every architecture "
                     "but gpt2; model.moe.* to qwen3_moe and mixtral."));
  f.push_back(text("model.from_hf", &Deck::model, &ModelConfig::from_hf,
                   "A Hugging Face model folder: its config.json gives every model.* key it determines (fsdpp ckpt "
                   "deck <folder> prints them); a model.* key the deck sets as well must agree with it. A config "
                   "fsdpp would compute differently (another rope_type, sliding windows, biases the architecture "
                   "lacks, ...) is refused by name. Start from its weights with checkpoint.init_from: <folder>."));
  f.back().type = "<folder>";
  f.back().default_doc = "none";
  f.back().get = [](const Deck&) { return std::string(); };  // the resolved deck holds the values it gave
  f.push_back(integer("model.vocab_size", &Deck::model, &ModelConfig::vocab_size, 1, "Vocabulary size V."));
  f.push_back(integer("model.context_length", &Deck::model, &ModelConfig::context_length, 1,
                      "Sequence length T (rows of wpe)."));
  f.push_back(integer("model.n_embd", &Deck::model, &ModelConfig::n_embd, 1,
                      "Embedding width C; a multiple of model.n_head."));
  f.push_back(integer("model.n_layer", &Deck::model, &ModelConfig::n_layer, 1, "Transformer blocks L."));
  f.push_back(integer("model.n_head", &Deck::model, &ModelConfig::n_head, 1, "Attention heads NH."));
  f.push_back(boolean("model.tie_embeddings", &Deck::model, &ModelConfig::tie_embeddings,
                      "LM head shares wte; false adds a separate lm_head [V, C]. Default true for gpt2, false "
                      "for llama."));
  f.push_back(choice("model.attention", &Deck::model, &ModelConfig::attention, kAttentions,
                     "Causal attention kernels. reference: row-blocked GEMMs, saves the B*NH*T*T probabilities; "
                     "batched: the same products as strided-batched GEMMs over all (batch x head) pairs (few "
                     "calls; a workspace of 2*B*T*(NH+2*NKV)*hs + B*T*C floats shared by the blocks); fused: "
                     "flash-style tiles with online softmax, saves B*NH*T floats and recomputes the probabilities "
                     "in backward; auto: fused on GPU builds, reference on CPU builds (faster there, and bitwise as "
                     "before)."));
  f.push_back(llama_only(integer("model.n_kv_head", &Deck::model, &ModelConfig::n_kv_head, 1,
                                 "llama only: key/value heads NKV (grouped-query attention); must divide "
                                 "model.n_head."), "model.n_head"));
  f.push_back(llama_only(integer("model.ffn_hidden", &Deck::model, &ModelConfig::ffn_hidden, 1,
                                 "llama only: SwiGLU MLP width F."), "from model.ffn_multiplier"));
  f.push_back(llama_only(real("model.ffn_multiplier", &Deck::model, &ModelConfig::ffn_multiplier, kPositive,
                              "llama only, when model.ffn_hidden is not given: F = ffn_multiplier x 8C/3 rounded "
                              "up to a multiple of model.ffn_multiple_of (Meta's rule; Llama 3 8B: 1.3, 1024)."),
                         "1"));
  f.push_back(llama_only(integer("model.ffn_multiple_of", &Deck::model, &ModelConfig::ffn_multiple_of, 1,
                                 "llama only: see model.ffn_multiplier."), "256"));
  f.push_back(llama_only(real("model.rope_theta", &Deck::model, &ModelConfig::rope_theta, kPositive,
                              "llama only: RoPE base theta (Llama 2: 10000, Llama 3: 500000, Qwen2: 1000000)."), "10000 (qwen2: 1e6)"));
  f.push_back(llama_only(real("model.rope_scaling_factor", &Deck::model, &ModelConfig::rope_scaling_factor,
                              kPositive, "llama only: Llama 3.1+ RoPE frequency scaling, Hugging Face's "
                              "rope_scaling.factor with rope_type llama3 (Llama 3.1: 8, Llama 3.2: 32); 1 is "
                              "plain RoPE. Set it (and the three below) from the model's config.json when "
                              "fine-tuning: the weights were trained with it."), "1"));
  f.push_back(llama_only(real("model.rope_low_freq_factor", &Deck::model, &ModelConfig::rope_low_freq_factor,
                              kPositive, "llama only: rope_scaling.low_freq_factor; pairs with wavelengths above "
                              "rope_original_context / this are slowed by the factor."), "1"));
  f.push_back(llama_only(real("model.rope_high_freq_factor", &Deck::model, &ModelConfig::rope_high_freq_factor,
                              kPositive, "llama only: rope_scaling.high_freq_factor; pairs with wavelengths "
                              "below rope_original_context / this keep their frequency."), "4"));
  f.push_back(llama_only(integer("model.rope_original_context", &Deck::model,
                                 &ModelConfig::rope_original_context, 1,
                                 "llama only: rope_scaling.original_max_position_embeddings."), "8192"));
  f.push_back(llama_only(real("model.norm_eps", &Deck::model, &ModelConfig::norm_eps, kPositive,
                              "llama only: RMSNorm epsilon (Llama 2: 1e-5 or 1e-6, Llama 3: 1e-5, Qwen2: 1e-6)."), "1e-05 (qwen2: 1e-06)"));
  f.push_back(llama_only(integer("model.head_dim", &Deck::model, &ModelConfig::head_dim, 0,
                                 "llama only: attention head width hs; 0 is n_embd / n_head. Qwen3 sets its own "
                                 "(Qwen3-30B-A3B: C 2048, NH 32, hs 128), even for RoPE."), "0 (n_embd / n_head)"));
  for (Field& moe : moe_fields()) f.push_back(std::move(moe));
  return f;
}

std::vector<Field> data_fields() {
  std::vector<Field> f;
  f.push_back(text("data.source", &Deck::data, &DataConfig::source,
                   "'synthetic' (the built-in corpus), the path of a token file, or a corpus folder (or its "
                   "index.json) from fsdpp tokenize. Not with data.sources."));
  f.back().get = [](const Deck& d) { return d.data.source.empty() ? std::string() : yaml_scalar(d.data.source); };
  f.push_back(choice("data.format", &Deck::data, &DataConfig::format, kFormats,
                     "Token file format: gpt2 (.bin with a 256 x int32 header), raw uint16 or uint32; auto "
                     "recognises the gpt2 header and otherwise reads uint16."));
  f.push_back(choice("data.order", &Deck::data, &DataConfig::order, kOrders,
                     "shuffled: seeded random windows; sequential: global batch s takes the next global_batch "
                     "windows of T+1 tokens at stride T from the start of the data, wrapping (an epoch) at the end."));
  f.push_back(real("data.val_fraction", &Deck::data, &DataConfig::val_fraction, kUnitHalfOpen,
                   "Fraction of the tokens held out for validation."));
  f.push_back(boolean("data.document_mask", &Deck::data, &DataConfig::document_mask,
                      "Attention inside a packed sequence does not cross document boundaries: a document ends with "
                      "data.eot_id, and token t starts a new one when token t-1 is data.eot_id."));
  f.push_back(boolean("data.reset_positions", &Deck::data, &DataConfig::reset_positions,
                      "RoPE positions restart at 0 at each document start (needs data.document_mask; llama and "
                      "qwen2 only: GPT-2's learned position table is refused)."));
  f.push_back(integer("data.eot_id", &Deck::data, &DataConfig::eot_id, -1,
                      "The end-of-text token id the document masks split at; -1: unset. Required with "
                      "data.document_mask, below model.vocab_size."));
  f.push_back(data_sources());
  return f;
}

std::vector<Field> optim_fields() {
  std::vector<Field> f;
  f.push_back(choice("optim.name", &Deck::optim, &OptimConfig::name, kOptimizers, "Optimizer."));
  f.push_back(real("optim.lr", &Deck::optim, &OptimConfig::lr, kPositive, "Peak learning rate."));
  f.push_back(real("optim.beta1", &Deck::optim, &OptimConfig::beta1, kUnitHalfOpen, "AdamW first-moment decay."));
  f.push_back(real("optim.beta2", &Deck::optim, &OptimConfig::beta2, kUnitHalfOpen, "AdamW second-moment decay."));
  f.push_back(real("optim.eps", &Deck::optim, &OptimConfig::eps, kPositive, "AdamW denominator epsilon."));
  f.push_back(real("optim.weight_decay", &Deck::optim, &OptimConfig::weight_decay, kNonNegative,
                   "Decoupled weight decay (AdamW) or L2 penalty (SGD)."));
  f.push_back(real("optim.momentum", &Deck::optim, &OptimConfig::momentum, kUnitHalfOpen, "SGD momentum."));
  f.push_back(boolean("optim.decay_embeddings", &Deck::optim, &OptimConfig::decay_embeddings,
                      "Apply weight decay to wte, wpe (and lm_head)."));
  f.push_back(boolean("optim.decay_norms", &Deck::optim, &OptimConfig::decay_norms,
                      "Apply weight decay to LayerNorm weights."));
  f.push_back(boolean("optim.decay_biases", &Deck::optim, &OptimConfig::decay_biases,
                      "Apply weight decay to biases."));
  return f;
}

std::vector<Field> schedule_fields() {
  std::vector<Field> f;
  f.push_back(choice("schedule.kind", &Deck::schedule, &ScheduleConfig::kind, kSchedules,
                     "Learning rate after warmup: constant, or cosine decay to schedule.min_lr at train.steps."));
  f.push_back(integer("schedule.warmup_steps", &Deck::schedule, &ScheduleConfig::warmup_steps, 0,
                      "Steps of linear warmup from 0 to optim.lr."));
  f.push_back(real("schedule.min_lr", &Deck::schedule, &ScheduleConfig::min_lr, kNonNegative,
                   "Final learning rate of the cosine decay."));
  return f;
}

std::vector<Field> train_fields() {
  std::vector<Field> f;
  f.push_back(integer("train.steps", &Deck::train, &TrainConfig::steps, 1, "Optimizer steps to run."));
  f.back().required = true;
  f.back().default_doc = "(required)";
  f.push_back(integer("train.global_batch", &Deck::train, &TrainConfig::global_batch, 1,
                      "Sequences per optimizer step, the same on any number of ranks."));
  f.push_back(integer("train.micro_batch", &Deck::train, &TrainConfig::micro_batch, 1,
                      "Sequences per rank per forward/backward; global_batch must be a multiple of micro_batch "
                      "x data-parallel ranks (the quotient is the number of accumulation steps)."));
  f.back().default_doc = "train.global_batch";
  f.push_back(real("train.grad_clip", &Deck::train, &TrainConfig::grad_clip, kNonNegative,
                   "Clip the global gradient norm to this; 0 turns clipping off."));
  f.push_back(integer("train.eval_interval", &Deck::train, &TrainConfig::eval_interval, 0,
                      "Validation loss every this many steps; 0 never."));
  f.push_back(integer("train.eval_batches", &Deck::train, &TrainConfig::eval_batches, 1,
                      "Micro-batches averaged for each validation loss."));
  f.push_back(integer("train.sample_interval", &Deck::train, &TrainConfig::sample_interval, 0,
                      "Log a greedy continuation of train.sample_prompt every this many steps (as llm.c prints "
                      "samples while it trains); 0 never."));
  f.push_back(text("train.sample_prompt", &Deck::train, &TrainConfig::sample_prompt,
                   "The text the samples continue."));
  f.push_back(integer("train.sample_tokens", &Deck::train, &TrainConfig::sample_tokens, 1,
                      "Tokens each sample generates; with the prompt's, at most model.context_length."));
  f.push_back(text("train.sample_tokenizer", &Deck::train, &TrainConfig::sample_tokenizer,
                   "The tokenizer.json or SentencePiece .model the training data was tokenized with, for the "
                   "samples' text."));
  f.back().type = "<file>";
  f.back().default_doc = "one token per byte (fsdpp tokenize's byte-level default)";
  f.back().get = [](const Deck& d) {  // unset stays unset in the resolved deck (the echo leaves empty values out)
    return d.train.sample_tokenizer.empty() ? std::string() : yaml_scalar(d.train.sample_tokenizer);
  };
  f.push_back(choice("train.on_nonfinite", &Deck::train, &TrainConfig::on_nonfinite, kNonFinite,
                     "A step whose loss or gradient norm is NaN or Inf: abort stops the run with an error naming the "
                     "step and the first parameter (in model order) with a non-finite gradient; skip leaves the "
                     "weights as they were (the data still advances) and logs the step."));
  f.push_back(integer("train.max_skipped_steps", &Deck::train, &TrainConfig::max_skipped_steps, 1,
                      "With on_nonfinite: skip, stop with an error after this many skipped steps in a row."));
  f.push_back(activation_checkpointing());
  f.push_back(boolean("train.reproducible", &Deck::train, &TrainConfig::reproducible,
                      "Bitwise-identical losses, gradient norms and weights on every data-parallel layout (1..N "
                      "ranks, any strategy, micro-batch split, offload, activation checkpointing) at a fixed mesh.tp: "
                      "micro-batches run as units of train.reproducible_unit sequences whose gradients are summed "
                      "exactly in fixed point (docs/reproducible.md). Needs fsdp.reduce_dtype f32."));
  f.push_back(integer("train.reproducible_unit", &Deck::train, &TrainConfig::reproducible_unit, 1,
                      "With train.reproducible: sequences per computation unit, the same on every layout; must "
                      "divide train.micro_batch. Larger units run larger GEMMs but allow fewer layouts."));
  f.push_back(integer("train.reproducible_chunks", &Deck::train, &TrainConfig::reproducible_chunks, 1,
                      "With train.reproducible: equal token chunks per sequence. Above 1, every product runs on one "
                      "chunk's rows and weight gradients are summed exactly chunk by chunk, so the run is bitwise the "
                      "same at every mesh.cp whose 2 x cp divides it (8: cp 1, 2 and 4). Must divide "
                      "model.context_length; needs model.attention fused."));
  return f;
}

std::vector<Field> log_fields() {
  std::vector<Field> f;
  f.push_back(integer("log.interval", &Deck::log, &LogConfig::interval, 1,
                      "Print a step-table row every this many steps."));
  f.push_back(integer("log.header_every", &Deck::log, &LogConfig::header_every, 0,
                      "Reprint the table header every this many rows; 0 prints it once."));
  return f;
}

std::vector<Field> fsdp_fields() {
  std::vector<Field> f;
  f.push_back(choice("fsdp.strategy", &Deck::fsdp, &FsdpConfig::strategy, kStrategies,
                     "full_shard (ZeRO-3), hybrid_shard (shard within dp_shard, replicate across dp_replicate), "
                     "shard_grad_op (ZeRO-2: keep parameters unsharded from forward to backward), no_shard (DDP)."));
  f.push_back(reshard_after_forward());
  f.push_back(choice("fsdp.param_dtype", &Deck::fsdp, &FsdpConfig::param_dtype, kFloatTypes,
                     "Type parameters are all-gathered and computed in; the sharded master copy stays f32."));
  f.push_back(choice("fsdp.reduce_dtype", &Deck::fsdp, &FsdpConfig::reduce_dtype, kFloatTypes,
                     "Type gradients are reduce-scattered and accumulated in."));
  f.push_back(choice("fsdp.output_dtype", &Deck::fsdp, &FsdpConfig::output_dtype, kFloatTypes,
                     "Type of each sharded module's forward output."));
  f.push_back(choice("fsdp.offload", &Deck::fsdp, &FsdpConfig::offload, kOffloads,
                     "cpu keeps sharded parameters, gradients and optimizer state in host memory."));
  f.push_back(choice("fsdp.accumulate", &Deck::fsdp, &FsdpConfig::accumulate, kAccumulations,
                     "Gradient accumulation: sharded reduce-scatters every micro-batch (sharded memory); "
                     "unsharded keeps full gradients and reduce-scatters once per step (less communication)."));
  f.push_back(choice("fsdp.replica_all_reduce", &Deck::fsdp, &FsdpConfig::replica_all_reduce, kReplicaAllReduces,
                     "hybrid_shard with sharded accumulation: every_micro_batch all-reduces each micro-batch's "
                     "reduced shards over the replicas; last_micro_batch (FSDP2's set_requires_all_reduce(False) "
                     "on all but the last) sums them locally and all-reduces once per step: 1/accumulation-steps "
                     "of the replica traffic, one more gradient shard of memory, losses equal within fp32 rounding."));
  f.push_back(prefetch("fsdp.forward_prefetch", &FsdpConfig::forward_prefetch,
                       "All-gathers each unit starts before its forward runs: the next 0, 1 (FSDP2's default) or 2 "
                       "units in forward order (0: each unit gathers when it runs; 2 holds one more unit's whole "
                       "parameters), or explicit lists per unit, h.0:h.1,h.2;h.1:h.3 (in files also a map, "
                       "{h.0: [h.1, h.2]}; units are h.<i> (layers.<i> for Llama) and root; units without a list prefetch 1). Losses are "
                       "bitwise the same for every setting."));
  f.push_back(prefetch("fsdp.backward_prefetch", &FsdpConfig::backward_prefetch,
                       "All-gathers each unit starts before its backward runs: the next 0, 1 (FSDP2's default) or 2 "
                       "units in backward order, or explicit lists per unit as for fsdp.forward_prefetch (in "
                       "backward, h.1:h.0 prefetches h.0 when h.1's backward starts)."));
  return f;
}

std::vector<Field> matmul_fields() {
  std::vector<Field> f;
  f.push_back(choice("matmul.precision", &Deck::matmul, &MatmulConfig::precision, kMatmulPrecisions,
                     "Precision of every float GEMM (linear layers, attention products, lm_head; forward and "
                     "backward): bf16 rounds the inputs to bf16 and accumulates in f32 (tensor cores on GPUs); "
                     "f32 computes in single precision (see matmul.tf32); auto is bf16 when fsdp.param_dtype is "
                     "bf16, else f32. Master weights, gradient reduction and optimizer state stay f32."));
  f.push_back(boolean("matmul.tf32", &Deck::matmul, &MatmulConfig::tf32,
                      "f32 GEMMs read their inputs as TF32 (10 mantissa bits, f32 accumulation): tensor cores on "
                      "GPU builds; CPU builds emulate it by rounding the inputs (same numbers, slower)."));
  f.back().default_doc = "true on GPU builds, false on CPU builds";
  return f;
}

std::vector<Field> mesh_fields() {
  std::vector<Field> f;
  f.push_back(mesh_dim("mesh.dp_replicate", &MeshConfig::dp_replicate,
                       "Replicas (outer mesh dimension; for hybrid_shard). Absent: no replicate dimension."));
  f.back().default_doc = "absent";
  f.push_back(mesh_dim("mesh.dp_shard", &MeshConfig::dp_shard,
                       "Ranks a parameter is sharded over (inner dimension); -1: the ranks left over."));
  f.push_back(integer("mesh.tp", &Deck::mesh, &MeshConfig::tp, 1,
                      "Tensor parallelism (Megatron-style): ranks that split every block's attention heads and "
                      "MLP width, and the vocabulary; the innermost mesh dimension (consecutive "
                      "ranks: keep it within a node). Parameters are then FSDP-sharded over dp_shard. 1: none."));
  f.push_back(boolean("mesh.tp_sequence_parallel", &Deck::mesh, &MeshConfig::tp_sequence_parallel,
                      "Sequence parallelism with mesh.tp > 1: the layer norms, residual adds and block outputs "
                      "hold 1/tp of the micro-batch's B*T tokens (contiguous rows; the sequence when B is 1); an "
                      "all-gather enters and a reduce-scatter leaves each tensor-parallel region instead of one "
                      "all-reduce. B*T must be a multiple of mesh.tp."));
  f.push_back(integer("mesh.ep", &Deck::mesh, &MeshConfig::ep, 1,
                      "Expert parallelism (MoE architectures): the routed experts of every sparse layer are split "
                      "over ep ranks, which send each token to its experts' ranks and back (all-to-all). ep is "
                      "taken from mesh.dp_shard, as torchtitan does: dp_shard = (dp_shard / ep) x ep with ep the "
                      "inner, consecutive ranks; the dp_shard / ep ranks that hold the same experts shard them. "
                      "Must divide mesh.dp_shard and model.moe.num_experts. 1: none."));
  f.push_back(integer("mesh.cp", &Deck::mesh, &MeshConfig::cp, 1,
                      "Context parallelism (long sequences): each sequence's model.context_length positions are "
                      "split over cp ranks, rank r holding chunks r and 2 cp - 1 - r of 2 cp equal chunks (the "
                      "causal mask's work balanced); attention passes key/value blocks round the cp ring. Between "
                      "dp_shard and tp in the mesh; parameters are sharded over dp_shard x cp. "
                      "model.context_length must be a multiple of 2 cp. 1: none."));
  f.push_back(integer("mesh.pp", &Deck::mesh, &MeshConfig::pp, 1,
                      "Pipeline parallelism: the blocks are cut into pp x pipeline.virtual_stages stages of "
                      "consecutive blocks (the embedding on the first, the final norm, head and loss on the last), "
                      "one group of ranks per stage; the outermost mesh dimension. Training runs the stages under "
                      "pipeline.schedule, composed with every other mesh dimension; `fsdpp plan` gives the stages, "
                      "their memory and the bubble. 1: none."));
  return f;
}

std::vector<Field> pipeline_fields() {
  std::vector<Field> f;
  f.push_back(choice("pipeline.schedule", &Deck::pipeline, &PipelineConfig::schedule, kPipelineSchedules,
                     "The order of the micro-batches' forwards and backwards on each stage: gpipe (all forwards, then "
                     "all backwards), 1f1b (one forward, one backward in turn after a warm-up), interleaved_1f1b "
                     "(Megatron's, over pipeline.virtual_stages stages per rank) or zero_bubble (ZB-H1: weight "
                     "gradients fill the bubble)."));
  f.push_back(integer("pipeline.microbatches", &Deck::pipeline, &PipelineConfig::microbatches, 0,
                      "Micro-batches per step that flow through the pipeline; 0: the step's micro-batches, "
                      "train.global_batch / (train.micro_batch x data-parallel ranks)."));
  f.push_back(pipeline_split());
  f.push_back(integer("pipeline.virtual_stages", &Deck::pipeline, &PipelineConfig::virtual_stages, 1,
                      "Stages per pipeline rank (interleaved_1f1b): rank r holds stages r, r + pp, r + 2 pp, ..."));
  return f;
}

std::vector<Field> comm_fields() {
  std::vector<Field> f;
  f.push_back(choice("comm.backend", &Deck::comm, &CommConfig::backend, kBackends,
                     "Collectives of training: nccl (device memory, GPU builds), mpi (host memory), or auto: nccl "
                     "when Kokkos computes on a GPU, mpi otherwise."));
  f.push_back(real("comm.timeout_s", &Deck::comm, &CommConfig::timeout_s, kNonNegative,
                   "Collective watchdog: a collective of training (MPI or NCCL) or a checkpoint save that has not "
                   "finished after this many seconds (a rank stuck or gone) is reported with its operation, mesh "
                   "dimension and step, and the job is aborted after the flight recorder's dumps; 0 turns the "
                   "watchdog off."));
  f.push_back(integer("comm.flight_records", &Deck::comm, &CommConfig::flight_records, 0,
                      "Flight recorder: each rank keeps its last this many collectives (about 100 bytes each), dumped "
                      "to <run.output>/flight when the watchdog fires, a rank aborts, or on SIGUSR2; explained by "
                      "`fsdpp debug flight`. 0 keeps none.", 1 << 24));
  f.push_back(boolean("comm.overlap", &Deck::comm, &CommConfig::overlap,
                      "Overlap communication with compute: a unit's gradient reduce-scatter (and the HSDP replica "
                      "all-reduce after it) is issued when its backward ends and waited for only when its result is "
                      "needed, and tensor-parallel input-gradient collectives run while the weight gradients are "
                      "computed. Losses are bitwise the same either way; false blocks on every collective (the "
                      "schedule before overlap, for comparison)."));
  return f;
}

std::vector<Field> checkpoint_fields() {
  std::vector<Field> f;
  f.push_back(text("checkpoint.dir", &Deck::checkpoint, &CheckpointConfig::dir, "Folder for checkpoints."));
  f.back().default_doc = "<run.output>/checkpoints";
  f.push_back(integer("checkpoint.interval", &Deck::checkpoint, &CheckpointConfig::interval, 0,
                      "Save every this many steps; 0 saves none."));
  f.push_back(resume());
  f.push_back(init_from());
  f.push_back(integer("checkpoint.keep_last", &Deck::checkpoint, &CheckpointConfig::keep_last, 0,
                      "Keep only this many most recent checkpoints; 0 keeps all."));
  f.push_back(boolean("checkpoint.async", &Deck::checkpoint, &CheckpointConfig::async,
                      "Write checkpoints in the background while training continues."));
  f.push_back(choice("checkpoint.on_error", &Deck::checkpoint, &CheckpointConfig::on_error, kOnErrors,
                     "A save that fails (full disk, read-only or vanished folder): abort stops the run with the "
                     "error; continue logs it and trains on, keeping the previous checkpoint (latest still names it)."));
  return f;
}

// The key table, section by section in deck_sections()'s order: that order is the help's and the echo's.
std::vector<Field> make_fields() {
  std::vector<Field> all;
  for (auto section : {run_fields, model_fields, data_fields, optim_fields, schedule_fields, train_fields, log_fields,
                       fsdp_fields, matmul_fields, mesh_fields, pipeline_fields, comm_fields, checkpoint_fields}) {
    std::vector<Field> fields = section();
    all.insert(all.end(), std::make_move_iterator(fields.begin()), std::make_move_iterator(fields.end()));
  }
  return all;
}

}  // namespace

const std::vector<Section>& deck_sections() {
  static const std::vector<Section> sections = {
      {"run", "Name, seed and output folder of the run."},
      {"model", "The architecture (model.arch: gpt2, llama, qwen2, qwen3, qwen3_moe or mixtral) and its shape; the "
                "defaults are GPT-2 small (124M). model.moe.* may be written as a map under model: moe: {...}."},
      {"data", "Training tokens."},
      {"optim", "Optimizer."},
      {"schedule", "Learning-rate schedule."},
      {"train", "Length and batch sizes."},
      {"log", "Step table."},
      {"fsdp", "Fully sharded data parallelism (FSDP2's fully_shard)."},
      {"matmul", "Precision of the matrix products (TF32, bf16 tensor cores)."},
      {"mesh", "Device mesh: dimension name -> size, outermost first."},
      {"pipeline", "Pipeline parallelism (mesh.pp > 1): stages and schedule."},
      {"comm", "Communicators of the mesh."},
      {"checkpoint", "Distributed checkpoints."}};
  return sections;
}

const std::vector<Field>& deck_fields() {
  static const std::vector<Field> fields = make_fields();
  return fields;
}

const std::vector<Alias>& deck_aliases() {
  static const std::vector<Alias> aliases = {
      {"", "optimizer", {"optim"}},        {"", "training", {"train"}},
      {"", "logging", {"log"}},            {"", "scheduler", {"schedule"}},
      {"", "lr_schedule", {"schedule"}},   {"", "ckpt", {"checkpoint"}},
      {"run", "output_dir", {"output"}},   {"run", "out_dir", {"output"}},
      {"model", "block_size", {"context_length"}}, {"model", "n_ctx", {"context_length"}},
      {"model", "seq_len", {"context_length"}},    {"model", "n_positions", {"context_length"}},
      {"model", "d_model", {"n_embd"}},    {"model", "hidden_size", {"n_embd"}},
      {"model", "num_layers", {"n_layer"}}, {"model", "num_heads", {"n_head"}},
      {"data", "path", {"source"}},        {"data", "file", {"source"}},
      {"optim", "learning_rate", {"lr"}},  {"optim", "optimizer", {"name"}},
      {"optim", "epsilon", {"eps"}},       {"schedule", "warmup", {"warmup_steps"}},
      {"schedule", "lr_min", {"min_lr"}},  {"schedule", "type", {"kind"}},
      {"train", "max_steps", {"steps"}},   {"train", "global_batch_size", {"global_batch"}},
      {"train", "micro_batch_size", {"micro_batch"}}, {"train", "local_batch_size", {"micro_batch"}},
      {"train", "clip_grad_norm", {"grad_clip"}}, {"train", "max_norm", {"grad_clip"}},
      {"log", "log_interval", {"interval"}},
      {"fsdp", "sharding_strategy", {"strategy"}}, {"fsdp", "cpu_offload", {"offload"}},
      {"checkpoint", "keep", {"keep_last"}},
      // Ambiguous: refused, never mapped to one of ours.
      {"train", "batch_size", {"global_batch", "micro_batch"}, "per process in nanoGPT and llm.c",
       "train.global_batch (sequences per optimizer step, all ranks) or train.micro_batch (per rank per forward)"},
      {"checkpoint", "path", {"dir", "resume", "init_from"},
       "a folder to save in, or a file to continue or start from, depending on the framework",
       "checkpoint.dir (the folder saves go to), checkpoint.resume (a checkpoint file to continue a run from) or "
       "checkpoint.init_from (weights to start a new run from)"}};
  return aliases;
}

}  // namespace fsdpp::deck_detail
