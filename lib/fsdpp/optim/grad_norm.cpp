#include "fsdpp/optim/grad_norm.hpp"

#include "fsdpp/comm/communicator.hpp"
#include "fsdpp/runtime/error.hpp"
#include "fsdpp/tensor/fixed_point.hpp"
#include "fsdpp/tensor/offload.hpp"

#include <cmath>
#include <limits>

namespace fsdpp {

// The words of a sum of squares, and how many non-finite elements it met: a Kokkos sum reduction's value.
struct ExactSquares {
  std::int64_t w[SquareWords::words + 1];  // the words, then the count of non-finite elements
  KOKKOS_INLINE_FUNCTION ExactSquares() {
    for (auto& x : w) x = 0;
  }
  KOKKOS_INLINE_FUNCTION ExactSquares& operator+=(const ExactSquares& o) {
    for (int j = 0; j <= SquareWords::words; ++j) w[j] += o.w[j];
    return *this;
  }
};

}  // namespace fsdpp

namespace Kokkos {
template <> struct reduction_identity<fsdpp::ExactSquares> {
  KOKKOS_FORCEINLINE_FUNCTION static fsdpp::ExactSquares sum() { return fsdpp::ExactSquares(); }
};
}  // namespace Kokkos

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

// A parameter whose shards differ across the tp ranks: its squares are summed over tp. The others are the same on
// every tp rank (replicated, or split over ep: expert parallelism's shards are replicated over tp).
bool split_over_tp(const Parameter& p) { return p.tensor_parallel() && !p.tensor_parallel()->expert; }

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

ExactSquares exact_squares_local(const std::vector<Parameter*>& params) {
  ExactSquares total;
  for (const Parameter* p : params) {
    const float* grad = p->grad().data();
    ExactSquares sum;
    reduce_over_index(
        "fsdpp::grad_norm_exact_squares", p->host_resident(), static_cast<std::int64_t>(p->grad().extent(0)),
        KOKKOS_LAMBDA(const std::int64_t j, ExactSquares& acc) {
          const double g = grad[j];
          if (g - g != 0.0) {  // NaN or Inf
            acc.w[SquareWords::words] += 1;
            return;
          }
          std::int64_t w[SquareWords::words];
          SquareWords::cut(g * g, w);  // exact: a float's square fits a double
          for (int k = 0; k < SquareWords::words; ++k) acc.w[k] += w[k];
        },
        Kokkos::Sum<ExactSquares>(sum));
    total += sum;
  }
  return total;
}

// The words summed over `group`: integers, so exactly (host buffer on MPI; NCCL reduces device memory only).
void reduce_words(ExactSquares& words, Communicator& group) {
  constexpr std::size_t n = SquareWords::words + 1;
  if (group.backend() == CommBackend::mpi) {
    group.all_reduce(words.w, n, ReduceOp::sum);
    return;
  }
  Kokkos::View<std::int64_t[n], MemSpace> buf("fsdpp::grad_norm_words");
  Kokkos::deep_copy(buf, Kokkos::View<std::int64_t[n], Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(words.w));
  Kokkos::fence();
  group.all_reduce(buf.data(), n, ReduceOp::sum);
  Kokkos::deep_copy(Kokkos::View<std::int64_t[n], Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(words.w), buf);
}

// The l2 norm with the squares summed exactly: the same bits for any split of the gradients over ranks (and over
// pipeline stages: their words summed over `stages`).
double exact_grad_norm(const std::vector<Parameter*>& params, Communicator* sum_over, Communicator* tensor_parallel,
                       Communicator* stages) {
  ExactSquares squared;
  if (tensor_parallel) {
    std::vector<Parameter*> split, replicated;
    for (Parameter* p : params) (split_over_tp(*p) ? split : replicated).push_back(p);
    squared = exact_squares_local(split);
    reduce_words(squared, *tensor_parallel);
    squared += exact_squares_local(replicated);
  } else {
    squared = exact_squares_local(params);
  }
  if (sum_over != nullptr) reduce_words(squared, *sum_over);
  if (stages != nullptr) reduce_words(squared, *stages);
  if (squared.w[SquareWords::words] > 0) return std::numeric_limits<double>::quiet_NaN();
  return std::sqrt(SquareWords::value(squared.w));
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

double global_grad_norm(const std::vector<Parameter*>& all_params, Communicator* sum_over, NormType type,
                        Communicator* tensor_parallel, Communicator* stages, const Parameter* counted_elsewhere) {
  std::vector<Parameter*> params;
  for (Parameter* p : all_params)
    if (p != counted_elsewhere) params.push_back(p);
  if (type == NormType::l2_exact) return exact_grad_norm(params, sum_over, tensor_parallel, stages);
  if (stages != nullptr) {  // this stage's norm, then the stages' together
    const double norm = global_grad_norm(params, sum_over, type, tensor_parallel);
    if (type == NormType::inf) return reduce_scalar(norm, *stages, ReduceOp::max);
    return std::sqrt(reduce_scalar(norm * norm, *stages, ReduceOp::sum));
  }
  if (type == NormType::inf) {
    double m = local_max_abs(params);
    if (tensor_parallel) m = reduce_scalar(m, *tensor_parallel, ReduceOp::max);
    return sum_over ? reduce_scalar(m, *sum_over, ReduceOp::max) : m;
  }
  double squared = 0.0;
  if (tensor_parallel) {
    std::vector<Parameter*> split, replicated;
    for (Parameter* p : params) (split_over_tp(*p) ? split : replicated).push_back(p);
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
                      Communicator* tensor_parallel, Communicator* stages, const Parameter* counted_elsewhere) {
  FSDPP_REQUIRE(max_norm > 0.0, "clip_grad_norm: max_norm must be > 0, got {} (to disable clipping, do not clip)",
                max_norm);
  const double norm = global_grad_norm(params, sum_over, type, tensor_parallel, stages, counted_elsewhere);
  const double coef = max_norm / (norm + 1e-6);
  // Every rank computes the same norm, so every rank takes the same branch.
  if (std::isfinite(norm) && coef < 1.0) scale_grads(params, static_cast<float>(coef));
  return norm;
}

}  // namespace fsdpp
