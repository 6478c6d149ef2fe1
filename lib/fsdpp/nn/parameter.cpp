#include "fsdpp/nn/parameter.hpp"

#include "fsdpp/runtime/error.hpp"

#include <Random123/philox.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

namespace fsdpp {

Parameter::Parameter(std::string local_name, std::vector<std::int64_t> shape, InitRule init, ParamRole role)
    : local_name_(local_name), name_(std::move(local_name)), shape_(std::move(shape)), local_shape_(shape_),
      init_(init), role_(role) {}

std::string TensorParallelPlacement::describe() const {
  if (dim == 0 && blocks > 1) return fmt::format("StridedShard(0, blocks={})", blocks);
  return fmt::format("Shard({})", dim);
}

namespace {
// torch.chunk over `ranks` (a tensor-parallel split of rows or columns): (offset, count) of part `rank` of `n`.
std::pair<std::int64_t, std::int64_t> tp_part_range(std::int64_t n, int ranks, int rank) {
  const std::int64_t chunk = chunk_rows(n, ranks);
  return {std::min<std::int64_t>(rank * chunk, n), std::clamp<std::int64_t>(n - rank * chunk, 0, chunk)};
}
}  // namespace

std::vector<std::int64_t> tensor_parallel_shape(const std::vector<std::int64_t>& shape, const TensorParallelPlacement& tp) {
  FSDPP_CHECK(tp.dim >= 0 && tp.dim < static_cast<int>(shape.size()) && tp.dim <= 1,
              "tensor parallel Shard({}) of a tensor of {} dimensions", tp.dim, shape.size());
  std::vector<std::int64_t> local = shape;
  if (tp.dim == 0) {
    FSDPP_CHECK(shape[0] % tp.blocks == 0, "StridedShard(0, blocks={}) of {} rows", tp.blocks, shape[0]);
    local[0] = tp.blocks * tp_part_range(shape[0] / tp.blocks, tp.ranks, tp.rank).second;
  } else {
    local[1] = tp_part_range(shape[1], tp.ranks, tp.rank).second;
  }
  return local;
}

std::vector<GlobalPiece> global_pieces_of(const std::vector<std::int64_t>& shape,
                                          const std::optional<TensorParallelPlacement>& tp,
                                          std::int64_t first_local_row, std::int64_t local_rows) {
  const std::int64_t global_rows = shape.empty() ? 1 : shape[0];
  const std::int64_t global_numel = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
  const std::int64_t row_size = global_rows == 0 ? 0 : global_numel / global_rows;
  std::vector<GlobalPiece> out;
  if (local_rows <= 0) return out;
  if (!tp) return {GlobalPiece{0, first_local_row, local_rows, 0, row_size}};
  if (tp->dim == 1) {
    const auto [col, cols] = tp_part_range(row_size, tp->ranks, tp->rank);
    return {GlobalPiece{0, first_local_row, local_rows, col, cols}};
  }
  // Shard(0) with `blocks` stacked parts: local rows are this rank's rows of part 0, then of part 1, ...
  const std::int64_t part_rows = global_rows / tp->blocks;
  const auto [offset, per_part] = tp_part_range(part_rows, tp->ranks, tp->rank);
  for (std::int64_t r = first_local_row; r < first_local_row + local_rows;) {
    const std::int64_t part = r / per_part, within = r % per_part;
    const std::int64_t n = std::min(per_part - within, first_local_row + local_rows - r);
    out.push_back({r - first_local_row, part * part_rows + offset + within, n, 0, row_size});
    r += n;
  }
  return out;
}

void Parameter::set_tensor_parallel(TensorParallelPlacement tp) {
  FSDPP_REQUIRE(!placement_ && !tp_ && value_.extent(0) == 0, "parameter '{}': tensor parallelism is applied once, "
                "on meta, before fully_shard (parallelize does it in that order)", name_);
  local_shape_ = tensor_parallel_shape(shape_, tp);
  tp_ = tp;
}

std::vector<GlobalPiece> Parameter::global_pieces() const {
  if (placement_) return global_pieces_of(shape_, tp_, placement_->offset_rows, placement_->local_rows);
  return global_pieces_of(shape_, tp_, 0, rows());
}

std::int64_t Parameter::global_numel() const {
  return std::accumulate(shape_.begin(), shape_.end(), std::int64_t{1}, std::multiplies<>());
}

std::int64_t Parameter::global_row_size() const {
  const std::int64_t r = shape_.empty() ? 1 : shape_[0];
  return r == 0 ? 0 : global_numel() / r;
}

void Parameter::allocate() {
  const auto n = static_cast<std::size_t>(storage_numel());
  if (placement_ && placement_->offloaded) {
    offloaded_value_ = offload_buffer(name_, n);
    offloaded_grad_ = offload_buffer(name_ + ".grad", n);
    value_ = offloaded_value_.view;
    grad_ = offloaded_grad_.view;
    return;
  }
  value_ = View1<float>(name_, n);  // zero-filled: the padding rows of a shard stay zero
  grad_ = View1<float>(name_ + ".grad", n);
}

void Parameter::adopt(View1<float> value, View1<float> grad) {
  value_ = std::move(value);
  grad_ = std::move(grad);
}

void Parameter::place(ShardPlacement placement) {
  FSDPP_REQUIRE(!placement_, "parameter '{}' is already placed on {}: fully_shard claims a parameter once", name_,
                placement_->mesh);
  placement_ = std::move(placement);
}

void Parameter::show_whole(View1<float> value) {
  value_ = std::move(value);
  unsharded_ = true;
}

void Parameter::show_whole_grad(View1<float> grad) { grad_ = std::move(grad); }

void Parameter::show_shard(View1<float> value, View1<float> grad) {
  value_ = std::move(value);
  grad_ = std::move(grad);
  unsharded_ = false;
}

std::int64_t Parameter::numel() const {
  return std::accumulate(local_shape_.begin(), local_shape_.end(), std::int64_t{1}, std::multiplies<>());
}

std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void fill_initial_values(const View1<float>& out, const InitRule& rule, std::uint64_t seed, const std::string& name,
                         std::int64_t first, std::int64_t cols, std::int64_t stride) {
  const std::int64_t n = static_cast<std::int64_t>(out.extent(0));
  if (cols <= 0) cols = n > 0 ? n : 1, stride = 0;
  if (rule.kind != InitRule::Kind::normal) {
    Kokkos::deep_copy(out, rule.kind == InitRule::Kind::ones ? 1.0f : 0.0f);
    return;
  }
  const std::uint64_t key_hash = name_hash(name);
  const auto k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
  const auto h0 = static_cast<std::uint32_t>(key_hash), h1 = static_cast<std::uint32_t>(key_hash >> 32);
  const double std_dev = rule.std;
  Kokkos::parallel_for(
      "fsdpp::init_normal", Kokkos::RangePolicy<ExecSpace>(0, n), KOKKOS_LAMBDA(const std::int64_t j) {
        const std::uint64_t i = static_cast<std::uint64_t>(first + (j / cols) * stride + j % cols);
        r123::Philox4x32 rng;
        const r123::Philox4x32::ctr_type counter = {{static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32), h0, h1}};
        const r123::Philox4x32::key_type key = {{k0, k1}};
        const r123::Philox4x32::ctr_type r = rng(counter, key);
        // Box-Muller on two 32-bit uniforms in (0, 1); double keeps the tails exact before rounding to f32.
        const double u1 = (static_cast<double>(r[0]) + 0.5) * 2.3283064365386963e-10;
        const double u2 = (static_cast<double>(r[1]) + 0.5) * 2.3283064365386963e-10;
        const double z = kmath::sqrt(-2.0 * kmath::log(u1)) * kmath::cos(6.283185307179586 * u2);
        out(j) = static_cast<float>(std_dev * z);
      });
}

}  // namespace fsdpp
