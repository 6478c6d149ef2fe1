#pragma once
// The deck's enumerations and their deck names, without the deck itself: for code that takes one choice from a
// deck (a checkpoint's on_error, a model's architecture) and has no business with the rest. The names are the
// key table's (deck_values.cpp), so to_string gives back what a deck says.
#include <string_view>

namespace fsdpp {

// qwen2: Llama's block with q/k/v biases; qwen3: Llama's block with per-head RMSNorm on q and k and its own
// head_dim; qwen3_moe: Qwen3's attention with mixture-of-experts MLPs; mixtral: Llama's attention with them.
enum class ModelArch { gpt2, llama, qwen2, qwen3, qwen3_moe, mixtral };
// model.moe.balance: how the router's load is kept even (nn/moe.hpp): Switch/HF's auxiliary loss, DeepSeek-V3's
// per-expert routing bias updated from each step's load (aux-loss-free; refused until implemented), or nothing.
enum class MoeBalance { aux_loss, bias, none };
enum class OptimizerKind { adamw, sgd };
enum class ScheduleKind { constant, cosine };
enum class DataFormat { automatic, gpt2, uint16, uint32 };
enum class DataOrder { shuffled, sequential };
enum class ShardStrategy { full_shard, hybrid_shard, shard_grad_op, no_shard };
enum class OffloadPolicy { none, cpu };
enum class GradAccumulation { unsharded, sharded };
// fsdp.replica_all_reduce: when HSDP all-reduces the reduced shards over the replicas during accumulation.
enum class ReplicaAllReduce { every_micro_batch, last_micro_batch };
enum class ResumeMode { off, on, automatic, path };
enum class CommBackendChoice { automatic, mpi, nccl };  // automatic: NCCL when Kokkos computes on a GPU
enum class CheckpointOnError { abort, keep_going };  // deck names: abort | continue
enum class NonFinitePolicy { abort, skip };  // what a step with a NaN/Inf loss or gradient norm does
enum class AttentionKind { automatic, fused, batched, reference };  // model.attention: nn/attention_kind.hpp
enum class MatmulPrecisionChoice { automatic, f32, bf16 };  // automatic: bf16 GEMMs when fsdp.param_dtype is bf16
// pipeline.schedule (mesh.pp > 1): parallel/pipeline_schedule.hpp. Deck names gpipe, 1f1b, interleaved_1f1b, zero_bubble.
enum class PipelineScheduleKind { gpipe, one_f_one_b, interleaved_1f1b, zero_bubble };

// The Llama family: Llama's block (RMSNorm, RoPE, grouped-query attention, SwiGLU), which reads the model.*
// keys the key table marks as the family's (deck_schema.cpp, llama_only).
constexpr bool is_llama_family(ModelArch arch) { return arch != ModelArch::gpt2; }
// The mixture-of-experts architectures: they read the model.moe.* keys (deck_schema.cpp, moe_only).
constexpr bool is_moe_arch(ModelArch arch) { return arch == ModelArch::qwen3_moe || arch == ModelArch::mixtral; }

std::string_view to_string(ModelArch v);
std::string_view to_string(MoeBalance v);
std::string_view to_string(OptimizerKind v);
std::string_view to_string(ScheduleKind v);
std::string_view to_string(DataFormat v);
std::string_view to_string(DataOrder v);
std::string_view to_string(ShardStrategy v);
std::string_view to_string(OffloadPolicy v);
std::string_view to_string(GradAccumulation v);
std::string_view to_string(ReplicaAllReduce v);
std::string_view to_string(ResumeMode v);
std::string_view to_string(CommBackendChoice v);
std::string_view to_string(CheckpointOnError v);
std::string_view to_string(NonFinitePolicy v);
std::string_view to_string(MatmulPrecisionChoice v);
std::string_view to_string(AttentionKind v);
std::string_view to_string(PipelineScheduleKind v);

}  // namespace fsdpp
