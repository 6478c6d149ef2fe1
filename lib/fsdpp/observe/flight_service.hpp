#pragma once
// A training run's flight recorder, as `fsdpp train` runs it (observe/flight_recorder.hpp has the records):
//  - keep the last comm.flight_records collectives;
//  - a PeerChannel (observe/peer_channel.hpp) over which a rank that is about to abort the job asks every other
//    rank to dump its records, and learns which did not answer;
//  - the abort hook (runtime/fatal.hpp): ask the others, dump this rank (with who did not answer), and say who
//    did not answer, where the dumps are and which command explains them (`fsdpp debug flight <dir>`);
//  - SIGUSR2: dump this rank's records while the run goes on.
// Dumps go to <run.output>/flight/rank<r>.json (observe/flight_dump.hpp).
//
// start() is collective over the run's ranks. The service stays after a run that ends by an exception, so the
// abort that follows (Runtime::fail) still dumps; the next start() or stop() ends it.
#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

namespace fsdpp {

class FlightService {
 public:
  static void start(MPI_Comm world, std::size_t records, const std::string& dir, double timeout_s);
  static void stop();
  static bool running();
  static std::vector<std::string> hosts();  // every world rank's host (empty while not running)

  // SIGUSR2 dumps the records while a run is in progress and is ignored otherwise (its default action would
  // kill the rank: mpiexec and scancel --signal=USR2 forward it to every rank).
  static void install_signal_handler();

  // Starts the service, and stops it when a run ends normally (not when an exception leaves it).
  class Run {
   public:
    Run(MPI_Comm world, std::size_t records, const std::string& dir, double timeout_s);
    ~Run();
    Run(const Run&) = delete;
    Run& operator=(const Run&) = delete;

   private:
    int exceptions_;
  };
};

}  // namespace fsdpp
