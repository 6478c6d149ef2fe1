// The NCCL backend. On a machine without a GPU (our CI) creating it must fail on every rank with a clear
// message; on a GPU machine the same test runs real collectives on device memory against a host reference.
#include "mpi_test.hpp"

#include "fsdpp/comm/make_communicator.hpp"
#include "fsdpp/mesh/device_mesh.hpp"
#include "fsdpp/nn/expert_parallel.hpp"
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
MPI_TEST_CASE("nccl: on a GPU, all_to_all_v (grouped send/recv) and an expert dispatch/combine on device memory", 1) {
  if (visible_gpus() == 0) return;
  auto comm = make_communicator(CommBackend::nccl, test_comm);
  // One peer (this rank): 300 floats from offset 7 of the send buffer to offset 11 of the receive buffer.
  std::vector<float> host(320);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = float(i * 3 + 1);
  float *send = nullptr, *recv = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&send), host.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&recv), host.size() * sizeof(float)) == cudaSuccess);
  cudaMemcpy(send, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  const std::size_t sc[1] = {300}, sd[1] = {7}, rc[1] = {300}, rd[1] = {11};
  comm->all_to_all_v(send, recv, AllToAllCounts{sc, sd, rc, rd}, DType::f32);
  std::vector<float> out(host.size());
  cudaMemcpy(out.data(), recv, out.size() * sizeof(float), cudaMemcpyDeviceToHost);
  int wrong = 0;
  for (std::size_t i = 0; i < 300; ++i) wrong += out[11 + i] != host[7 + i];
  CHECK(wrong == 0);
  comm->all_to_all_v_async(send, recv, AllToAllCounts{sc, sd, rc, rd}, DType::f32)->wait();
  cudaDeviceSynchronize();
  cudaFree(send);
  cudaFree(recv);

  // The expert exchange on device memory: 3 experts, rows by expert; one rank receives its own rows in the same
  // order, and combine brings them back.
  ExpertParallelGroup group(comm.get(), 3, 4, 64);
  ExpertRouting route = group.make_routing("h.0.mlp");
  std::vector<std::int64_t> counts = {5, 0, 9};
  std::vector<float> rows(14 * 4);
  for (std::size_t i = 0; i < rows.size(); ++i) rows[i] = float(i);
  View1<float> rows_d("rows", rows.size());
  View1<std::int64_t> counts_d("counts", 3);
  Kokkos::deep_copy(rows_d, HostView1<float>(rows.data(), rows.size()));
  Kokkos::deep_copy(counts_d, HostView1<std::int64_t>(counts.data(), counts.size()));
  View1<float> received_d("received", 64 * 4), home_d("home", 64 * 4);
  const View1<float> received = group.dispatch(route, rows_d, counts_d, received_d);
  std::vector<float> back(rows.size());
  Kokkos::deep_copy(HostView1<float>(back.data(), back.size()), received);
  CHECK(back == rows);
  const View1<float> home = group.combine(route, received, home_d);
  Kokkos::deep_copy(HostView1<float>(back.data(), back.size()), home);
  CHECK(back == rows);
}
#endif
