#pragma once
// What `fsdpp debug flight <dir>` says about a folder of flight-recorder dumps (observe/flight_dump.hpp): it lines
// the ranks up, communicator by communicator (a mesh dimension's group: its label and its members), and says in
// one paragraph
//  - which ranks dumped and which did not (named as missing, with their hosts, never guessed at), and what
//    the ranks that aborted or asked for the dumps reported;
//  - for a desynchronised job, the first sequence number where the ranks of a group issued different
//    collectives (operation, element count, dtype or site) and what each issued;
//  - for a hang, the collective the job is stuck in (the oldest one some rank started and none finished),
//    which ranks entered it and how long they had waited when they dumped, and which never entered it (with
//    what they did last), on which host;
//  - otherwise that nothing hangs and where each group stands.
#include <string>

namespace fsdpp {

// UsageError when `dir` holds no readable dump.
std::string explain_flight_dumps(const std::string& dir);

}  // namespace fsdpp
