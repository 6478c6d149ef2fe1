#include "fsdpp/runtime/error.hpp"

#include <mpi.h>

namespace fsdpp {

std::string located(const char* file, int line, const std::string& message) {
  return fmt::format("{}:{}: {}", file, line, message);
}

void throw_mpi_error(const char* call, int rc, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(located(file, line, fmt::format("{} failed: {} (MPI error {})", call, text, rc)));
}

}  // namespace fsdpp
