#include "fsdpp/optim/grad_norm.hpp"

#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/offload.hpp"

#include <cmath>

namespace fsdpp {

double grad_norm_squared_local(const std::vector<Parameter*>& params) {
  double total = 0.0;
  for (const Parameter* p : params) {
    const float* grad = p->grad().data();
    const std::int64_t n = static_cast<std::int64_t>(p->grad().extent(0));
    double sum = 0.0;
    reduce_over_index(
        "fsdpp::grad_norm_squared", p->host_resident(), n,
        KOKKOS_LAMBDA(const std::int64_t j, double& acc) {
          const double g = grad[j];
          acc += g * g;
        },
        sum);
    total += sum;
  }
  return total;
}

namespace {

double local_max_abs(const std::vector<Parameter*>& params) {
  double result = 0.0;
  for (const Parameter* p : params) {
    const float* grad = p->grad().data();
    double m = 0.0;
    reduce_over_index(
        "fsdpp::grad_max_abs", p->host_resident(), static_cast<std::int64_t>(p->grad().extent(0)),
        KOKKOS_LAMBDA(const std::int64_t j, double& acc) {
          const double a = grad[j] < 0 ? -static_cast<double>(grad[j]) : static_cast<double>(grad[j]);
          if (a > acc || a != a) acc = a;  // NaN wins, so a broken gradient shows in the norm
        },
        Kokkos::Max<double>(m));
    if (m > result || m != m) result = m;
  }
  return result;
}

// One double reduced over `group` (host buffer on MPI; NCCL reduces device memory only).
double reduce_scalar(double value, Communicator& group, ReduceOp op) {
  if (group.backend() == CommBackend::mpi) {
    group.all_reduce(&value, 1, op);
    return value;
  }
  Kokkos::View<double, MemSpace> buf("fsdpp::grad_norm_buffer");
  Kokkos::deep_copy(buf, value);
  Kokkos::fence();
  group.all_reduce(buf.data(), 1, op);
  Kokkos::deep_copy(value, buf);
  return value;
}

}  // namespace

double global_grad_norm(const std::vector<Parameter*>& params, Communicator* sum_over, NormType type,
                        Communicator* tensor_parallel) {
  if (type == NormType::inf) {
    double m = local_max_abs(params);
    if (tensor_parallel) m = reduce_scalar(m, *tensor_parallel, ReduceOp::max);
    return sum_over ? reduce_scalar(m, *sum_over, ReduceOp::max) : m;
  }
  double squared = 0.0;
  if (tensor_parallel) {
    std::vector<Parameter*> split, replicated;
    for (Parameter* p : params) (p->tensor_parallel() ? split : replicated).push_back(p);
    squared = reduce_scalar(grad_norm_squared_local(split), *tensor_parallel, ReduceOp::sum) +
              grad_norm_squared_local(replicated);
  } else {
    squared = grad_norm_squared_local(params);
  }
  if (sum_over != nullptr) squared = reduce_scalar(squared, *sum_over, ReduceOp::sum);
  return std::sqrt(squared);
}

void scale_grads(const std::vector<Parameter*>& params, float factor) {
  for (const Parameter* p : params) {
    float* grad = p->grad().data();
    const std::int64_t n = static_cast<std::int64_t>(p->grad().extent(0));
    for_each_index("fsdpp::grad_scale", p->host_resident(), n, KOKKOS_LAMBDA(const std::int64_t j) { grad[j] *= factor; });
  }
}

double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm, Communicator* sum_over, NormType type,
                      Communicator* tensor_parallel) {
  FSDPP_REQUIRE(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got {} (to disable clipping, do not clip)",
                max_norm);
  const double norm = global_grad_norm(params, sum_over, type, tensor_parallel);
  const double coef = max_norm / (norm + 1e-6);
  // Every rank computes the same norm, so every rank takes the same branch.
  if (std::isfinite(norm) && coef < 1.0) scale_grads(params, static_cast<float>(coef));
  return norm;
}

}  // namespace fsdpp
