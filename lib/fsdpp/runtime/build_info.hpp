#pragma once
// What this binary was built with and runs on: the `fsdpp --version` banner users paste into bug reports.
#include <string>
#include <utility>
#include <vector>

namespace fsdpp {

// (component, version) rows: fsdpp, Kokkos (with backends), MPI, HDF5, BLAS, CUDA, NCCL.
std::vector<std::pair<std::string, std::string>> build_info();
std::string kokkos_description();  // "3.4.01 (Serial)"
std::string blas_description();    // OpenBLAS's own config string
std::string format_build_info();   // the rows as an aligned table
// The NCCL library's version ("2.28.9"; "unknown" when it cannot say, "not built" without CUDA/NCCL). Here
// rather than in comm/ because the banner reports it too, and runtime sits below comm.
std::string nccl_library_version();

}  // namespace fsdpp
