#pragma once
// Two kinds of error, after LAMMPS's error->all / error->one split (docs/stack-notes.md §1.5):
//  - UsageError: every rank detects it identically (a bad deck, an invalid mesh). Rank 0 prints it once and
//    every rank exits non-zero.
//  - Error: one rank detects it (a failed MPI call, a corrupt buffer). That rank prints it with "[rank r]" and
//    the job is aborted, since the other ranks may be blocked in a collective and would otherwise hang.
// Library code throws; app/main.cpp (through Runtime::report_and_exit) turns the exception into the exit path.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace fsdpp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class UsageError : public Error {
 public:
  using Error::Error;
};

// "file:line: message" — the location helps developers; the message itself says what to do.
std::string located(const char* file, int line, const std::string& message);

}  // namespace fsdpp

// FSDPP_CHECK(cond, "fmt", args...) throws fsdpp::Error with file:line when cond is false.
#define FSDPP_CHECK(cond, ...)                                                                   \
  do {                                                                                           \
    if (!(cond)) throw ::fsdpp::Error(::fsdpp::located(__FILE__, __LINE__, fmt::format(__VA_ARGS__))); \
  } while (0)

// FSDPP_REQUIRE(cond, ...) is the same check for input that every rank sees alike (throws UsageError).
#define FSDPP_REQUIRE(cond, ...)                                                                 \
  do {                                                                                           \
    if (!(cond)) throw ::fsdpp::UsageError(fmt::format(__VA_ARGS__));                            \
  } while (0)

// FSDPP_MPI_CHECK(MPI_Foo(...)) names the failing call and its MPI error string.
#define FSDPP_MPI_CHECK(call)                                                                    \
  do {                                                                                           \
    const int fsdpp_mpi_rc_ = (call);                                                            \
    if (fsdpp_mpi_rc_ != MPI_SUCCESS) ::fsdpp::throw_mpi_error(#call, fsdpp_mpi_rc_, __FILE__, __LINE__); \
  } while (0)

namespace fsdpp {
[[noreturn]] void throw_mpi_error(const char* call, int rc, const char* file, int line);
}
