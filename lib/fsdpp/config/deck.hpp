#pragma once
// The YAML input deck: one struct per section, every key with a default except train.steps (how long to
// train cannot be guessed). `fsdpp train --help-deck` prints each key's type, default and meaning.
//
// Parsing is pure (no MPI, no files): rank 0 reads the deck file and broadcasts its text, and every rank calls
// parse_deck on the same text, file name and overrides, so every rank either gets the same Deck or throws the
// same UsageError (printed once by rank 0, docs/stack-notes.md §1.5).
//
// The schema lives in one table (deck_schema.cpp); adding a key there adds it to parsing, unknown-key
// detection, the help text and the resolved-deck echo at once. The rules that tie keys together (divisibility,
// head sizes, strategy and mesh combinations, batch splits) are functions of their own (deck_rules.hpp), which
// parse_deck, parallelize and the models call alike.
#include "fsdpp/config/deck_enums.hpp"
#include "fsdpp/tensor/dtype.hpp"
#include "fsdpp/tensor/matmul.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdpp {

// FSDP2's reshard_after_forward: None | bool | int. "automatic" is None: true for every group but the root.
struct ReshardAfterForward {
  enum class Kind { automatic, yes, no, group } kind = Kind::automatic;
  int group_size = 0;  // Kind::group: keep a 1/group_size slice after forward (FSDP2's int k; >= 2)
};

// fsdp.forward_prefetch / fsdp.backward_prefetch: how many units ahead each unit starts the next all-gathers
// (0, 1 or 2; FSDP2 prefetches 1), or explicit per-unit lists (FSDP2's set_modules_to_forward_prefetch): unit
// name -> the units it prefetches, in order. Units without a list prefetch `depth` ahead.
struct PrefetchSetting {
  int depth = 1;
  std::vector<std::pair<std::string, std::vector<std::string>>> lists;
};

// train.activation_checkpointing: which transformer blocks recompute their forward in backward instead of
// keeping their activations (torchtitan's apply_ac: full, or layer-selective every k-th block).
struct ActivationCheckpointing {
  enum class Kind { none, full, every } kind = Kind::none;
  int every = 0;  // Kind::every: k >= 2; blocks k-1, 2k-1, ... (every k-th, counting from 1) recompute
  bool recomputes(int block) const {
    return kind == Kind::full || (kind == Kind::every && (block + 1) % every == 0);
  }
};

struct RunConfig {
  std::string name;    // default: the deck file's name without its extension
  std::uint64_t seed = 1337;
  std::string output;  // default: runs/<name>; holds the log copy, the resolved deck and metrics.jsonl
  // run.trace: the optimizer steps (1-based, inclusive) recorded into <output>/trace (observe/timeline.hpp);
  // 0, 0: none.
  std::int64_t trace_first = 0, trace_last = 0;
  // run.machine: a machine preset or description (plan/machine.hpp); the end of the run prints the predicted
  // ms/step beside the measured one. Empty: no prediction.
  std::string machine;
};

// model.moe: the mixture-of-experts MLP of qwen3_moe and mixtral (nn/moe.hpp), Hugging Face's names in brackets.
// A layer is sparse per is_moe_layer; the others keep a dense SwiGLU MLP of model.ffn_hidden.
struct MoeConfig {
  int num_experts = 8;           // E [num_experts, num_local_experts]
  int top_k = 2;                 // experts each token is sent to [num_experts_per_tok]
  int expert_ffn_hidden = 0;     // each expert's SwiGLU width [moe_intermediate_size; Mixtral: intermediate_size]
  bool norm_topk_prob = true;    // the top-k probabilities renormalised to sum to 1 (Mixtral always does)
  MoeBalance balance = MoeBalance::aux_loss;
  double aux_loss_coef = 0.001;  // [router_aux_loss_coef]: the load-balancing loss's weight in the training loss
  double router_z_loss_coef = 0.0;  // ST-MoE's z-loss, mean(logsumexp(router logits)^2), its weight
  int sparse_step = 1;           // [decoder_sparse_step]: layer l is sparse when (l + 1) % sparse_step == 0
  std::vector<int> dense_layers; // [mlp_only_layers]: layers kept dense whatever sparse_step says
  double capacity_factor = 0.0;  // 0: dropless; c > 0: each expert takes at most ceil(c * N * top_k / E) tokens
  double bias_update_rate = 0.001;  // balance: bias, DeepSeek-V3's gamma: each step b_e += rate * sign(mean - load_e)
};

// Defaults are GPT-2 small (124M): the one architecture everyone can check against.
struct ModelConfig {
  ModelArch arch = ModelArch::gpt2;
  int vocab_size = 50257;  // V
  int context_length = 1024;  // T (maximum sequence length, rows of wpe)
  int n_embd = 768;   // C
  int n_layer = 12;   // L
  int n_head = 12;    // NH
  bool tie_embeddings = true;  // llama: false unless set
  AttentionKind attention = AttentionKind::automatic;  // the attention kernels (nn/attention_kind.hpp)
  // Llama family only (llama, qwen2; a gpt2 deck that sets one is refused). parse_deck fills n_kv_head (n_head)
  // and ffn_hidden (llama_ffn_hidden of the multiplier) when they are not given, and for qwen2 Qwen2's
  // rope_theta (1e6) and norm_eps (1e-6).
  int n_kv_head = 0;            // NKV, dividing NH
  int ffn_hidden = 0;           // F, the SwiGLU width
  double ffn_multiplier = 1.0;  // Meta's ffn_dim_multiplier, when ffn_hidden is not given
  int ffn_multiple_of = 256;    // Meta's multiple_of, likewise
  double rope_theta = 10000.0;  // RoPE base
  // Llama 3.1+ RoPE frequency scaling (HF rope_scaling, rope_type llama3); factor 1: none.
  double rope_scaling_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int rope_original_context = 8192;
  double norm_eps = 1e-5;       // RMSNorm eps
  // Attention head width hs; 0: n_embd / n_head. Qwen3's is free of the two (Qwen3-30B-A3B: C 2048, NH 32, hs 128).
  int head_dim = 0;
  MoeConfig moe;                // qwen3_moe, mixtral only
  // A Hugging Face model folder whose config.json gives the keys above (parse_deck's ModelSourceReader reads
  // it); the deck's own model.* keys must agree with it. Not echoed: the resolved deck holds the values.
  std::string from_hf;
};

// Hugging Face's rule (Qwen3MoeDecoderLayer): whether block `layer` (from 0) has the mixture-of-experts MLP.
inline bool is_moe_layer(const ModelConfig& m, int layer) {
  if (!is_moe_arch(m.arch) || m.moe.num_experts <= 0) return false;
  for (int dense : m.moe.dense_layers)
    if (dense == layer) return false;
  return (layer + 1) % m.moe.sparse_step == 0;
}
// The head width hs the blocks use.
inline int head_size(const ModelConfig& m) { return m.head_dim > 0 ? m.head_dim : m.n_embd / m.n_head; }

// data.sources: one entry of a weighted mixture (data/mixture.hpp).
struct DataSource {
  std::string path;     // a token file, a corpus folder or its index.json
  double weight = 1.0;  // > 0; the mixture normalises the weights
  // Where the path was given, for errors about it: "deck.yaml:9:13: data.sources entry 2 path" (not echoed).
  std::string where = "data.sources";
};

struct DataConfig {
  // "synthetic", a token file, or a corpus folder or its index.json; empty when data.sources gives a mixture
  // (check_data_sources: one or the other).
  std::string source = "synthetic";
  DataFormat format = DataFormat::automatic;
  DataOrder order = DataOrder::shuffled;
  double val_fraction = 0.05;
  // Packed sequences (docs/models-and-data.md, "Document masks"): attention stays inside each document, a
  // document ending with the end-of-text token eot_id (token t starts a new one when token t-1 is eot_id);
  // reset_positions restarts RoPE positions at 0 at each document start. document_masks() resolves them.
  bool document_mask = false;
  bool reset_positions = false;
  std::int64_t eot_id = -1;  // -1: unset (required with document_mask)
  std::vector<DataSource> sources;  // data.sources; empty: data.source alone
};

struct OptimConfig {
  OptimizerKind name = OptimizerKind::adamw;
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double momentum = 0.9;  // sgd only
  bool decay_embeddings = false;
  bool decay_norms = false;
  bool decay_biases = false;
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::constant;
  std::int64_t warmup_steps = 0;
  double min_lr = 0.0;
};

struct TrainConfig {
  std::int64_t steps = 0;  // required
  int global_batch = 8;    // sequences per optimizer step, whatever the number of ranks
  int micro_batch = 0;     // sequences per rank per forward/backward; default: global_batch
  double grad_clip = 1.0;  // 0: no clipping
  std::int64_t eval_interval = 100;  // 0: never
  int eval_batches = 4;
  // Samples while training (train/training_samples.hpp): every sample_interval steps, sample_tokens greedy tokens
  // after sample_prompt, tokenized by sample_tokenizer (empty: one token per byte).
  std::int64_t sample_interval = 0;  // 0: never
  std::string sample_prompt = "The";
  int sample_tokens = 32;
  std::string sample_tokenizer;
  // A step whose loss or gradient norm is NaN or Inf: abort (a UsageError naming the step and the first
  // parameter with a non-finite gradient), or skip its optimizer update (the sampler still advances); after
  // max_skipped_steps skipped steps in a row, the run stops as abort would.
  NonFinitePolicy on_nonfinite = NonFinitePolicy::abort;
  int max_skipped_steps = 10;
  ActivationCheckpointing activation_checkpointing;
  // Reproducible mode (docs/reproducible.md): losses, gradient norms and weights bitwise the same on every
  // data-parallel layout. Each micro-batch runs as micro_batch / reproducible_unit units of this many sequences,
  // and the units' gradients, losses and the squared norm are summed exactly in fixed point.
  bool reproducible = false;
  int reproducible_unit = 1;
  // Token chunks per sequence: >1 runs every product on one chunk's rows and sums weight gradients exactly chunk
  // by chunk, so the bits are also the same at any mesh.cp whose 2 cp divides it (check_reproducible_chunks).
  int reproducible_chunks = 1;
};

struct LogConfig {
  std::int64_t interval = 10;
  int header_every = 25;  // reprint the step-table header every this many rows; 0: only once
};

struct FsdpConfig {
  ShardStrategy strategy = ShardStrategy::full_shard;
  ReshardAfterForward reshard_after_forward;
  DType param_dtype = DType::f32;   // f32 or bf16
  DType reduce_dtype = DType::f32;  // f32 or bf16
  DType output_dtype = DType::f32;  // f32 or bf16
  OffloadPolicy offload = OffloadPolicy::none;
  GradAccumulation accumulate = GradAccumulation::sharded;
  ReplicaAllReduce replica_all_reduce = ReplicaAllReduce::every_micro_batch;  // HSDP with sharded accumulation
  PrefetchSetting forward_prefetch, backward_prefetch;
};

// Known dimensions only, so that a typo is caught; 0 means the dimension is absent from the mesh.
struct MeshConfig {
  int dp_replicate = 0;
  int dp_shard = -1;
  // Tensor parallelism: the innermost mesh dimension (consecutive ranks, so within a node). 1: none.
  int tp = 1;
  // Sequence parallelism (Megatron-SP): between the tensor-parallel regions the B*T token rows are split over
  // tp (norms, residual adds and the block outputs hold 1/tp of them); all-gather before, reduce-scatter after.
  bool tp_sequence_parallel = false;
  // Expert parallelism (MoE models): each expert lives on one of ep ranks, which exchange tokens all-to-all.
  // Borrowed from dp_shard as torchtitan does: dp_shard = (dp_shard / ep) x ep, ep the inner (consecutive)
  // part; the dp_shard / ep ranks holding the same experts shard them (the experts' data parallelism). 1: none.
  int ep = 1;
  // Context parallelism (long sequences): each sequence's T positions split over cp ranks in the load-balanced
  // causal layout (rank r holds chunks r and 2 cp - 1 - r of 2 cp), attention as a ring of K/V blocks
  // (nn/context_parallel.hpp). Between dp_shard and tp; parameters shard over dp_shard x cp. 1: none.
  int cp = 1;
  // Pipeline parallelism: the outermost mesh dimension (a stage's ranks are consecutive, so they share nodes);
  // the blocks are cut into pp x pipeline.virtual_stages stages of consecutive blocks. 1: none.
  int pp = 1;
};

// Pipeline parallelism (mesh.pp > 1): how the blocks are cut into stages and in what order the micro-batches'
// forwards and backwards run (parallel/pipeline_schedule.hpp).
struct PipelineConfig {
  PipelineScheduleKind schedule = PipelineScheduleKind::one_f_one_b;
  int microbatches = 0;     // 0: the step's micro-batches (train.global_batch / (micro_batch x data-parallel ranks))
  std::vector<int> split;   // the first block of stages 1 .. S-1; empty: balanced by each block's FLOPs
  int virtual_stages = 1;   // stages per pipeline rank (interleaved_1f1b)
};

// The precision of every float GEMM (tensor/matmul.hpp); master weights, gradient reduction and optimizer
// state are not affected.
struct MatmulConfig {
  MatmulPrecisionChoice precision = MatmulPrecisionChoice::automatic;
  bool tf32 = tf32_is_native();  // f32 GEMMs in TF32: on by default where tensor cores do it (GPU builds)
};

struct CommConfig {
  CommBackendChoice backend = CommBackendChoice::automatic;
  double timeout_s = 600;  // collective watchdog: abort the job when an MPI collective takes longer; 0: off
  std::int64_t flight_records = 4096;  // flight recorder: the last collectives each rank keeps (observe/flight_recorder.hpp)
  bool overlap = true;  // gradient reductions and tensor-parallel collectives run while compute goes on; false: blocking
};

struct CheckpointConfig {
  std::string dir;  // default: <run.output>/checkpoints
  std::int64_t interval = 0;  // 0: no periodic checkpoints
  ResumeMode resume = ResumeMode::off;
  std::string resume_path;  // ResumeMode::path: the checkpoint file to resume from
  std::string init_from = "none";  // weights to start from (fine-tuning): a checkpoint, consolidated or safetensors file
  int keep_last = 0;  // 0: keep all
  bool async = false;
  CheckpointOnError on_error = CheckpointOnError::abort;  // a failed save: stop, or train on with the previous one
};

struct Deck {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  LogConfig log;
  FsdpConfig fsdp;
  MatmulConfig matmul;
  MeshConfig mesh;
  PipelineConfig pipeline;
  CommConfig comm;
  CheckpointConfig checkpoint;
};

// A model described outside the deck (model.from_hf: a Hugging Face folder's config.json, read by
// ckpt/hf_config.hpp): its model, and every deck key it determines with the field that gave it.
struct ModelSource {
  ModelConfig model;
  std::string where;  // "<folder>/config.json", for messages
  struct Key {
    std::string deck_key;  // "model.n_embd"
    std::string field;     // "hidden_size"
    // The deck may hold less (Llama's context_length: RoPE has no table, so training on sequences shorter than
    // max_position_embeddings is the same model).
    bool deck_may_be_less = false;
  };
  std::vector<Key> keys;
};
// Reads the folder model.from_hf names. parse_deck itself reads no file: its caller passes how (app/, which
// reads on rank 0 and maps the text on every rank).
using ModelSourceReader = std::function<ModelSource(const std::string& folder)>;

// Parses deck text plus "section.key=value" overrides (applied after the file, in order, last one wins) and
// fills every default. `file_name` appears in error messages and names the run by default. With model.from_hf,
// `from_hf` reads the folder: its keys fill the model section, and a model.* key the deck sets to another value
// is an error naming both. Throws UsageError.
Deck parse_deck(const std::string& yaml_text, const std::string& file_name,
                const std::vector<std::string>& overrides = {}, const ModelSourceReader& from_hf = {});

// Where `model` (a deck's) contradicts `source`, one line per key: "model.n_embd is 32, but hidden_size is 64 in
// <where>". Empty: the same model.
std::vector<std::string> model_conflicts(const ModelConfig& model, const ModelSource& source);

// The given keys ("model.arch", ...) of `deck` as YAML, grouped by section in the key table's order.
std::string deck_keys_yaml(const Deck& deck, const std::vector<std::string>& keys);

// The deck with every default filled, in the table's key order; parse_deck of it gives the same Deck.
std::string resolved_deck_yaml(const Deck& deck);

// Every key with its type, default and meaning (`fsdpp train --help-deck`).
std::string deck_help();

// Every key's path ("train.steps"), in table order.
std::vector<std::string> deck_keys();

// Meta's rule for the Llama MLP width: 2/3 of 4C, times the multiplier, rounded up to a multiple of multiple_of
// (Llama 3 8B: C 4096, 1.3, 1024 -> 14336; Llama 3.2 1B: C 2048, 1.5, 256 -> 8192).
int llama_ffn_hidden(int n_embd, double multiplier, int multiple_of);


// The precision the deck's GEMMs run in: matmul.precision bf16, or auto with fsdp.param_dtype bf16, gives bf16;
// otherwise tf32 when matmul.tf32 is true, else f32.
GemmPrecision resolved_gemm_precision(const Deck& deck);
std::string to_string(const ReshardAfterForward& v);
std::string to_string(const ActivationCheckpointing& v);  // none | full | every_<k>
std::string to_string(const PrefetchSetting& v);          // 0 | 1 | 2 | h.3:h.4,h.5;h.4:h.6

}  // namespace fsdpp
