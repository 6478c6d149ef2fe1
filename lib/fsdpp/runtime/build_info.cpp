#include "fsdpp/runtime/build_info.hpp"

#include "fsdpp/version.hpp"

#include <Kokkos_Core.hpp>
#include <fmt/format.h>
#include <hdf5.h>
#include <mpi.h>

#ifdef FSDPP_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace fsdpp {
namespace {

#ifdef FSDPP_HAVE_CUDA
std::string decode_nccl_version(int code) {
  // 2.9 changed the encoding from major*1000 + minor*100 + patch to major*10000 + minor*100 + patch.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  return fmt::format("{}.{}.{}", major, minor, code % 100);
}

std::string decode_cuda_version(int code) { return fmt::format("{}.{}", code / 1000, code % 1000 / 10); }

// "NCCL 2.28.9 (CUDA runtime 13.0, driver 13.0)". Safe to call without a GPU or driver.
std::string nccl_version_string() {
  int runtime = 0;
  int driver = 0;
  const bool have_runtime = cudaRuntimeGetVersion(&runtime) == cudaSuccess;
  const bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
  cudaGetLastError();  // a missing driver must not poison later CUDA calls
  return fmt::format("NCCL {} (CUDA runtime {}, {})", nccl_library_version(),
                     have_runtime ? decode_cuda_version(runtime) : "unknown",
                     have_driver ? "driver " + decode_cuda_version(driver) : std::string("no CUDA driver"));
}
#endif

}  // namespace

std::string nccl_library_version() {
#ifdef FSDPP_HAVE_CUDA
  int code = 0;
  return ncclGetVersion(&code) == ncclSuccess ? decode_nccl_version(code) : "unknown";
#else
  return "not built";
#endif
}

std::string kokkos_description() {
  std::string backends;
  auto add = [&](const char* name) { backends += backends.empty() ? name : std::string(", ") + name; };
#if defined(KOKKOS_ENABLE_CUDA)
  add("Cuda");
#endif
#if defined(KOKKOS_ENABLE_HIP)
  add("HIP");
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
  add("OpenMP");
#endif
#if defined(KOKKOS_ENABLE_THREADS)
  add("Threads");
#endif
#if defined(KOKKOS_ENABLE_SERIAL)
  add("Serial");
#endif
  constexpr int v = KOKKOS_VERSION;
  return fmt::format("{}.{}.{:02d} ({})", v / 10000, (v / 100) % 100, v % 100, backends);
}

BuildInfoRows build_info(const BuildInfoRows& matmul_rows) {
  BuildInfoRows rows;
  rows.emplace_back("fsdpp", fmt::format("{} ({})", FSDPP_VERSION, git_revision()));
  rows.emplace_back("Kokkos", kokkos_description());

  char mpi_library[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int length = 0;
  MPI_Get_library_version(mpi_library, &length);
  std::string mpi(mpi_library, static_cast<std::size_t>(length));
  if (auto cut = mpi.find_first_of(",\n"); cut != std::string::npos) mpi.resize(cut);
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  rows.emplace_back("MPI", fmt::format("{} (MPI {}.{})", mpi, major, minor));

  unsigned h5_major = 0, h5_minor = 0, h5_release = 0;
  H5get_libversion(&h5_major, &h5_minor, &h5_release);
#ifdef H5_HAVE_PARALLEL
  const char* h5_kind = "parallel";
#else
  const char* h5_kind = "serial";
#endif
  rows.emplace_back("HDF5", fmt::format("{}.{}.{} ({})", h5_major, h5_minor, h5_release, h5_kind));
  rows.insert(rows.end(), matmul_rows.begin(), matmul_rows.end());
#ifdef FSDPP_HAVE_CUDA
  rows.emplace_back("CUDA/NCCL", nccl_version_string());
#else
  rows.emplace_back("CUDA/NCCL", "not built (configure with -DFSDPP_ENABLE_CUDA=ON)");
#endif
  return rows;
}

std::string format_build_info(const BuildInfoRows& matmul_rows) {
  std::string out;
  for (const auto& [name, version] : build_info(matmul_rows)) out += fmt::format("  {:<10} {}\n", name, version);
  return out;
}

}  // namespace fsdpp
