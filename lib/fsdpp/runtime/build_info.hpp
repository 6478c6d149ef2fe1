#pragma once
// What this binary was built with and runs on: the `fsdpp --version` banner users paste into bug reports.
#include <string>
#include <utility>
#include <vector>

namespace fsdpp {

using BuildInfoRows = std::vector<std::pair<std::string, std::string>>;

// (component, version) rows: fsdpp, Kokkos (with backends), MPI, HDF5, then `matmul_rows`, then CUDA/NCCL.
// runtime/ sits below tensor/, so the matrix-product rows (BLAS, GEMM) come from the caller:
// tensor/matmul.hpp's matmul_build_info().
BuildInfoRows build_info(const BuildInfoRows& matmul_rows);
std::string kokkos_description();
// `git describe` of the checkout at configure time, "unknown" outside git. In a generated source file of its own
// (lib/fsdpp/runtime/git_revision.cpp.in), so that a new commit recompiles that file alone, not the unity batch or
// the ccache entries of every file that names the version.
const char* git_revision();  // "3.4.01 (Serial)"
std::string format_build_info(const BuildInfoRows& matmul_rows);  // the rows as an aligned table
// The NCCL library's version ("2.28.9"; "unknown" when it cannot say, "not built" without CUDA/NCCL). Here
// rather than in comm/ because the banner reports it too, and runtime sits below comm.
std::string nccl_library_version();

}  // namespace fsdpp
