// fsdpp debug flight <dir>: explain a hang or a desynchronised job from the flight recorder's dumps
// (<run.output>/flight/rank<r>.json), in one paragraph: which rank never entered which collective and on which
// host, who waits and for how long, or where the ranks' collectives first differ (observe/flight_analysis.hpp).
// Reads files only: runs anywhere, on one process, GPU builds included.
#include "commands.hpp"

#include "fsdpp/observe/flight_analysis.hpp"

namespace fsdpp::app {

Command add_debug_command(CLI::App& app) {
  auto* cli = app.add_subcommand("debug", "Diagnose a run after the fact");
  cli->require_subcommand(1);
  auto* flight = cli->add_subcommand("flight", "Explain a hang or a desynchronised job from its flight-recorder "
                                               "dumps (<run.output>/flight)");
  auto dir = std::make_shared<std::string>();
  flight->add_option("dir", *dir, "The folder of rank<r>.json dumps")->required();
  return {cli, [dir](Runtime& rt) {
            if (rt.rank() == 0) Log::info("{}", explain_flight_dumps(*dir));
            return 0;
          },
          [] { return false; }};
}

}  // namespace fsdpp::app
