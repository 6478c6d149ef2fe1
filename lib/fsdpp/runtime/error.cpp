#include "fsdpp/runtime/error.hpp"

#include <mpi.h>

#include <string_view>

namespace fsdpp {

std::string located(const char* file, int line, const std::string& message) {
  // __FILE__ is relative to the checkout (share/cmake/FsdppCcache.cmake), with "../" in front where ccache made
  // the path relative to the build folder: the location reads the same from every clone and build.
  std::string_view path(file);
  while (path.substr(0, 3) == "../") path.remove_prefix(3);
  return fmt::format("{}:{}: {}", path, line, message);
}

void throw_mpi_error(const char* call, int rc, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(located(file, line, fmt::format("{} failed: {} (MPI error {})", call, text, rc)));
}

}  // namespace fsdpp
