#include "fsdpp/optim/grad_norm.hpp"

#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/runtime/error.hpp"

#include <cmath>

namespace fsdpp {

double grad_norm_squared_local(const std::vector<Parameter*>& params) {
  double total = 0.0;
  for (const Parameter* p : params) {
    const View1<const float> grad = p->grad;
    const std::int64_t n = static_cast<std::int64_t>(grad.extent(0));
    double sum = 0.0;
    Kokkos::parallel_reduce(
        "fsdpp::grad_norm_squared", Kokkos::RangePolicy<ExecSpace>(0, n),
        KOKKOS_LAMBDA(const std::int64_t j, double& acc) {
          const double g = grad(j);
          acc += g * g;
        },
        sum);
    total += sum;
  }
  return total;
}

double global_grad_norm(const std::vector<Parameter*>& params, Communicator* sum_over) {
  double squared = grad_norm_squared_local(params);
  if (sum_over != nullptr) {
    if (sum_over->backend() == CommBackend::mpi) {
      sum_over->all_reduce(&squared, 1, ReduceOp::sum);
    } else {
      // NCCL reduces device memory only.
      Kokkos::View<double, MemSpace> buf("fsdpp::grad_norm_squared_buffer");
      Kokkos::deep_copy(buf, squared);
      Kokkos::fence();
      sum_over->all_reduce(buf.data(), 1, ReduceOp::sum);
      Kokkos::deep_copy(squared, buf);
    }
  }
  return std::sqrt(squared);
}

void scale_grads(const std::vector<Parameter*>& params, float factor) {
  for (const Parameter* p : params) {
    const View1<float> grad = p->grad;
    const std::int64_t n = static_cast<std::int64_t>(grad.extent(0));
    Kokkos::parallel_for(
        "fsdpp::grad_scale", Kokkos::RangePolicy<ExecSpace>(0, n),
        KOKKOS_LAMBDA(const std::int64_t j) { grad(j) *= factor; });
  }
}

double clip_grad_norm(const std::vector<Parameter*>& params, double max_norm, Communicator* sum_over) {
  FSDPP_REQUIRE(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got {} (to disable clipping, do not clip)",
                max_norm);
  const double norm = global_grad_norm(params, sum_over);
  const double coef = max_norm / (norm + 1e-6);
  // Every rank computes the same norm, so every rank takes the same branch.
  if (std::isfinite(norm) && coef < 1.0) scale_grads(params, static_cast<float>(coef));
  return norm;
}

}  // namespace fsdpp
