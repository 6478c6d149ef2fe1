// Uses the installed fsdpp: Runtime, a DeviceMesh, one all-reduce whose result it checks.
#include <fsdpp/mesh/device_mesh.hpp>
#include <fsdpp/runtime/runtime.hpp>
#include <fsdpp/version.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  fsdpp::Runtime runtime(argc, argv);
  fsdpp::DeviceMesh mesh(runtime.world(), {{"dp", -1}});
  double value = runtime.rank() + 1;
  mesh.comm("dp").all_reduce(&value, 1, fsdpp::ReduceOp::sum);
  const double expected = runtime.size() * (runtime.size() + 1) / 2.0;
  if (runtime.rank() == 0) std::printf("consumer of fsdpp %s: all_reduce %g (expected %g)\n", FSDPP_VERSION, value, expected);
  return value == expected ? 0 : 1;
}
