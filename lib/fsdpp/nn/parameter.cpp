#include "fsdpp/nn/parameter.hpp"

#include "fsdpp/runtime/error.hpp"

#include <Random123/philox.h>
#include <fmt/format.h>

#include <numeric>

namespace fsdpp {

Parameter::Parameter(std::string local_name, std::vector<std::int64_t> shape, InitRule init, ParamRole role)
    : local_name_(local_name), name_(std::move(local_name)), shape_(std::move(shape)), init_(init), role_(role) {}

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
  return std::accumulate(shape_.begin(), shape_.end(), std::int64_t{1}, std::multiplies<>());
}

std::string Parameter::shape_string() const {
  std::string out = "[";
  for (std::size_t i = 0; i < shape_.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", shape_[i]);
  return out + "]";
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
                         std::int64_t first) {
  const std::int64_t n = static_cast<std::int64_t>(out.extent(0));
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
        const std::uint64_t i = static_cast<std::uint64_t>(first + j);
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
