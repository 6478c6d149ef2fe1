// The NCCL backend. On a machine without a GPU (our CI) creating it must fail on every rank with a clear
// message; on a GPU machine the same test runs real collectives on device memory against a host reference.
#include "mpi_test.hpp"

#include "fsdpp/comm/make_communicator.hpp"
#include "fsdpp/mesh/device_mesh.hpp"
#include "fsdpp/runtime/error.hpp"

#ifdef FSDPP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <vector>

using namespace fsdpp;

#ifndef FSDPP_HAVE_CUDA
MPI_TEST_CASE("nccl: a build without CUDA says so when the backend is asked for", 1) {
  CHECK_THROWS_WITH_AS(make_communicator(CommBackend::nccl, test_comm), doctest::Contains("configured without CUDA/NCCL"),
                       UsageError);
}
#else
namespace {
int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}
}  // namespace

MPI_TEST_CASE("nccl: without a GPU, creating the backend fails on every rank with a clear error", 2) {
  if (visible_gpus() > 0) return;  // the GPU case below covers this machine
  CHECK_THROWS_WITH_AS(DeviceMesh(test_comm, {{"dp", -1}}, CommBackend::nccl),
                       doctest::Contains("NCCL backend needs a CUDA GPU"), UsageError);
  CHECK_THROWS_WITH_AS(make_communicator(CommBackend::nccl, test_comm), doctest::Contains("use the 'mpi' communicator backend"),
                       UsageError);
  DeviceMesh host_mesh(test_comm, {{"dp", -1}}, CommBackend::mpi);  // and nobody is left hanging
  CHECK(host_mesh.size() == 2);
}

MPI_TEST_CASE("nccl: on a GPU, all_gather / reduce_scatter / all_reduce on device memory match the reference", 1) {
  // One rank: NCCL refuses two ranks on one GPU, and a test machine may have only one.
  if (visible_gpus() == 0) return;
  auto comm = make_communicator(CommBackend::nccl, test_comm);
  const std::size_t count = 1000;
  const int n = comm->size();
  std::vector<float> host(count * n);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = float(i % 17 + test_rank);
  float *send = nullptr, *recv = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&send), host.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&recv), host.size() * sizeof(float)) == cudaSuccess);
  cudaMemcpy(send, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);

  comm->reduce_scatter(send, recv, count, DType::f32, {ReduceOp::sum, 0.5, 4.0});
  std::vector<float> out(count);
  cudaMemcpy(out.data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost);
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += out[i] != 2.0f * n * float((test_rank * count + i) % 17 + test_rank);
  CHECK(wrong == 0);

  comm->all_gather(send, recv, count, DType::f32);
  std::vector<float> gathered(count * n);
  cudaMemcpy(gathered.data(), recv, gathered.size() * sizeof(float), cudaMemcpyDeviceToHost);
  wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += gathered[test_rank * count + i] != host[i];
  CHECK(wrong == 0);

  auto work = comm->all_reduce_async(send, count, DType::f32, ReduceOp::max);
  work->wait();
  cudaDeviceSynchronize();
  cudaMemcpy(out.data(), send, count * sizeof(float), cudaMemcpyDeviceToHost);
  CHECK(out[0] == float(0 % 17 + (n - 1)));
  CHECK_THROWS_WITH_AS(comm->all_reduce(host.data(), count, DType::f32, ReduceOp::sum), doctest::Contains("device memory"), Error);
  cudaFree(send);
  cudaFree(recv);
}
#endif
