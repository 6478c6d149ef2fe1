#pragma once
// Parameter: a named tensor with a global shape and an init rule that does not depend on where or how it is
// stored. A model can therefore be built with no memory at all ("meta"), sharded, and only then given storage
// (to_empty) and values (reset_parameters): element i of a tensor gets the same value however it is split.
#include "fsdpp/tensor/exact_words.hpp"
#include "fsdpp/tensor/offload.hpp"
#include "fsdpp/tensor/types.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdpp {

// GPT-2's initial standard deviation (and Llama's reference one) of embeddings and projections; the projections
// into the residual stream take kInitStd / sqrt(2 n_layer).
inline constexpr float kInitStd = 0.02f;

struct InitRule {
  enum class Kind { normal, zeros, ones };
  Kind kind = Kind::zeros;
  float std = 0.0f;  // for normal: N(0, std^2)
  static InitRule normal(float std) { return {Kind::normal, std}; }
  static InitRule zeros() { return {Kind::zeros, 0.0f}; }
  static InitRule ones() { return {Kind::ones, 0.0f}; }
};

// How an optimizer treats a parameter by default (AdamW decays only matrices that are not embeddings).
enum class ParamRole { weight, bias, norm, embedding };

// A dimension of the device mesh a placement refers to, by name and size (DeviceMesh's MeshDim, as data).
struct PlacementDim {
  std::string name;  // "dp_shard", "dp_replicate", "tp"
  int size = 1;
};

// Where a parameter sharded by fully_shard lives: rows split along dim 0 like torch.chunk. Every rank keeps a
// padded buffer of chunk_rows rows; the first local_rows of them are real, starting at global row offset_rows.
struct ShardPlacement {
  int ranks = 1;
  int rank = 0;
  std::int64_t chunk_rows = 0;   // ceil(rows / ranks): the padded rows every rank stores
  std::int64_t offset_rows = 0;  // min(rank * chunk_rows, rows)
  std::int64_t local_rows = 0;   // real rows here: chunk_rows, fewer on the last ranks, or 0
  // The mesh fully_shard was given, outermost first: rows are split over the last dimension (DTensor's
  // Shard(0)) and replicated over any before it (HSDP's dp_replicate: Replicate()).
  std::vector<PlacementDim> mesh_dims;
  std::string mesh;              // the same mesh, for messages ("dp_shard=4 (4 ranks, mpi)")
  bool offloaded = false;        // CPU offload: the shard, its gradient and optimizer state live in host memory
  std::string memory;            // where the shard lives: "Host", "Cuda", "host (pinned)", ...
};

// Tensor parallelism: DTensor's placement of a parameter on the mesh's `tp` dimension (Shard(dim)). A parameter
// without one is Replicate() over tp. The part a TP rank holds, the TP-local tensor, is what its kernels compute
// with and what fully_shard then shards along dim 0 over dp_shard (FSDP2's 2-D composition).
//   dim 0, blocks 1: rows split like torch.chunk (column-parallel Linear weights and biases, the vocabulary)
//   dim 0, blocks b: dim 0 is b equal stacked parts, each split alike (c_attn's q, k, v: DTensor's _StridedShard)
//   dim 1:           columns split (row-parallel Linear weights: the input features)
// Expert parallelism places a mixture of experts' stacked experts the same way, Shard(0) over mesh.ep (`expert`):
// then the tp ranks, if any, hold the same experts (replicated over tp).
struct TensorParallelPlacement {
  int dim = 0;
  int ranks = 1, rank = 0;
  int blocks = 1;
  std::string mesh_dim = "tp";   // the mesh dimension the split is over (TensorParallelGroup's)
  bool expert = false;           // over the expert-parallel ranks (ExpertParallelGroup's), not tp
  std::string describe() const;  // "Shard(0)", "Shard(1)", "StridedShard(0, blocks=3)"
};

// A run of rows of a parameter's local storage that lies in one place of the whole tensor, both seen as
// row-major (rows x row size): rows [local_row, local_row + rows) of the storage hold columns
// [global_col, global_col + cols) of rows [global_row, global_row + rows) of the whole tensor.
struct GlobalPiece {
  std::int64_t local_row = 0, global_row = 0, rows = 0;
  std::int64_t global_col = 0, cols = 0;
};

// torch.chunk's rows per rank: ceil(rows / ranks); every rank stores this many, the last ones padded.
constexpr std::int64_t chunk_rows(std::int64_t rows, int ranks) { return (rows + ranks - 1) / ranks; }

class Parameter {
 public:
  Parameter(std::string local_name, std::vector<std::int64_t> shape, InitRule init, ParamRole role);

  const std::string& name() const { return name_; }  // hierarchical: "h.0.attn.c_attn.weight"
  const std::string& local_name() const { return local_name_; }
  // The whole tensor's shape (DTensor's .shape): what checkpoints and imports hold.
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t global_numel() const;
  // The TP-local tensor (the whole shape without tensor parallelism): what this rank's kernels see while
  // fully_shard has it unsharded, and what fully_shard shards. numel, rows and row_size are of this tensor.
  const std::vector<std::int64_t>& local_shape() const { return local_shape_; }
  std::int64_t numel() const;
  std::int64_t rows() const { return local_shape_.empty() ? 1 : local_shape_[0]; }  // dim 0, the dimension FSDP splits
  std::int64_t row_size() const { return rows() == 0 ? 0 : numel() / rows(); }
  std::int64_t global_row_size() const;

  // Tensor parallelism (above): set once, on meta, before fully_shard; the local shape follows.
  void set_tensor_parallel(TensorParallelPlacement tp);
  const std::optional<TensorParallelPlacement>& tensor_parallel() const { return tp_; }
  // Where the real (unpadded) rows of this rank's storage lie in the whole tensor: one piece without tensor
  // parallelism, up to `blocks` for a strided shard.
  std::vector<GlobalPiece> global_pieces() const;
  const InitRule& init() const { return init_; }
  ParamRole role() const { return role_; }
  // A parameter the optimizer leaves alone (torch's requires_grad=False; a buffer Hugging Face files hold, such as
  // DeepSeek-V3's routing bias): sharded, checkpointed and exported like any other, updated by its own module.
  void set_trainable(bool on) { trainable_ = on; }
  bool trainable() const { return trainable_; }

  // Storage; empty while the parameter is on "meta". Values (and gradients) are f32 master copies.
  // value() and grad() are what kernels and optimizers read and write: once sharded (placement set) the padded
  // local shard, (chunk_rows, row_size), except while fully_shard has the parameter unsharded for a pass, when
  // they are the whole tensor.
  const View1<float>& value() const { return value_; }
  const View1<float>& grad() const { return grad_; }
  bool is_meta() const { return value_.extent(0) == 0 && storage_numel() > 0; }
  // value() and grad() are offload memory (tensor/offload.hpp): the shard of a CPU-offloaded parameter
  // between passes. Elementwise work on them belongs on the host.
  bool host_resident() const { return placement_ && placement_->offloaded && !unsharded_; }

  // The only ways storage changes, each with one caller:
  void allocate();                                    // Module::to_empty: zeroed, storage_numel() each,
                                                      // in offload memory when the placement is offloaded
  void adopt(View1<float> value, View1<float> grad);  // storage made elsewhere (fully_shard keeping an
                                                      // allocated parameter's rows; tests)
  void place(ShardPlacement placement);               // fully_shard, once, before the shard has storage
  void show_whole(View1<float> value);                // fully_shard: the whole tensor for a pass
  void show_whole_grad(View1<float> grad);            // fully_shard: the whole gradient during backward
  void show_shard(View1<float> value, View1<float> grad);  // fully_shard: back to the shards
  void use_grad(View1<float> grad) { grad_ = std::move(grad); }  // fully_shard: the shard's, once reduced
  // Reproducible mode's token chunks (train.reproducible_chunks): during backward, the fixed-point words the whole
  // gradient's chunks are added to (add_chunk_gradient, nn/gradient_chunks.hpp); inactive otherwise.
  void show_grad_words(SlotWords words) { grad_words_ = std::move(words); }
  const SlotWords& grad_words() const { return grad_words_; }

  const std::optional<ShardPlacement>& placement() const { return placement_; }
  bool unsharded() const { return unsharded_; }  // value/grad currently hold the whole tensor
  bool is_sharded() const { return placement_.has_value() && !unsharded_; }
  std::int64_t storage_numel() const { return placement_ ? placement_->chunk_rows * row_size() : numel(); }
  std::int64_t local_numel() const { return placement_ ? placement_->local_rows * row_size() : numel(); }

 private:
  friend class Module;
  View1<float> value_, grad_;
  SlotWords grad_words_;
  OffloadBuffer offloaded_value_, offloaded_grad_;  // owners of value_/grad_'s shard memory when offloaded
  std::optional<ShardPlacement> placement_;
  std::optional<TensorParallelPlacement> tp_;
  bool unsharded_ = false;
  bool trainable_ = true;
  std::string local_name_;
  std::string name_;
  std::vector<std::int64_t> shape_, local_shape_;
  InitRule init_;
  ParamRole role_;
};

// The TP-local shape of a tensor of `shape` under `tp`.
std::vector<std::int64_t> tensor_parallel_shape(const std::vector<std::int64_t>& shape, const TensorParallelPlacement& tp);
// The pieces (GlobalPiece) of local rows [first_local_row, first_local_row + local_rows) of the TP-local tensor
// of a tensor of `shape` under `tp` (none: replicated), numbered from local row 0 of that range. Any rank's,
// not only this one's: a checkpoint save lays out every rank's pieces.
std::vector<GlobalPiece> global_pieces_of(const std::vector<std::int64_t>& shape,
                                          const std::optional<TensorParallelPlacement>& tp,
                                          std::int64_t first_local_row, std::int64_t local_rows);

// Fill `out` with elements of the parameter's flattened initial tensor: element j of `out` is element
// first + (j / cols) * stride + j % cols of the whole tensor (cols 0: a contiguous run, first + j). The value
// of element i depends only on (seed, parameter name, i): a Philox counter-based generator, keyed by the seed
// and a hash of the name, counted by i (Random123; Salmon et al., SC'11).
void fill_initial_values(const View1<float>& out, const InitRule& rule, std::uint64_t seed, const std::string& name,
                         std::int64_t first, std::int64_t cols = 0, std::int64_t stride = 0);

std::uint64_t name_hash(const std::string& name);  // FNV-1a, stable across runs and machines

}  // namespace fsdpp
