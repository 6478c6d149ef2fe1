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

}  // namespace fsdpp
