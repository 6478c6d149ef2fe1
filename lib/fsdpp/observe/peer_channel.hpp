#pragma once
// PeerChannel: a side channel between the ranks of a run that works when MPI does not. Each rank has a UDP
// socket and a thread that answers on it, so that a rank about to abort the job can ask every other rank to
// dump its flight records and learn which ranks did not answer - stopped, gone, or cut off from it: the ranks
// a hang is to be blamed on. Its thread also takes SIGUSR2 (through a pipe, from the signal handler) to dump
// this rank's records while the run goes on.
//
// Built collectively at the start of training (it never throws before its collectives, so a rank that cannot
// open a socket does not leave the others waiting): one MPI_Allgather of each rank's host name, UDP port and IPv4
// addresses (a few hundred bytes per rank); nothing of it uses MPI afterwards. A rank on the same host is asked
// on 127.0.0.1, one on another host on that host's own non-loopback addresses: only the job's own ranks are
// ever addressed. Every datagram carries a random token of the run; others are ignored.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace fsdpp {

class PeerChannel {
 public:
  // Called on the channel's thread: a peer's request (its rank and reason), or SIGUSR2 (rank -1).
  using DumpRequest = std::function<void(int asking_rank, const std::string& reason)>;

  PeerChannel(MPI_Comm world, const std::string& host, DumpRequest on_request);  // collective over `world`
  ~PeerChannel();
  PeerChannel(const PeerChannel&) = delete;
  PeerChannel& operator=(const PeerChannel&) = delete;

  int rank() const { return rank_; }
  const std::vector<std::string>& hosts() const { return hosts_; }  // host of every world rank

  // Asks every other rank to dump its records and waits up to `wait_s` seconds for their answers (asking again
  // every 200 ms); returns the ranks that did not answer, in order, or nullopt when there is no channel to ask
  // on. Any thread; the channel's own keeps answering meanwhile.
  std::optional<std::vector<int>> ask_all_to_dump(const std::string& reason, double wait_s) const;

  // False when some rank could not open its socket (all or nothing: then no rank asks, and nobody is blamed
  // for not answering); problem() says which rank and why.
  bool usable() const { return problem_.empty(); }
  const std::string& problem() const { return problem_; }

  // Async-signal-safe: wakes the channel's thread to dump this rank's records (a SIGUSR2 handler calls it).
  // Does nothing while no channel exists.
  static void wake_from_signal();

 private:
  struct Card;  // what each rank publishes: host, port (0: none), addresses
  void serve();
  void release() noexcept;

  int rank_ = 0;
  std::uint64_t token_ = 0;
  int socket_ = -1;
  int pipe_[2] = {-1, -1};  // [0] read by the thread; [1] written by the signal handler and the destructor
  std::vector<std::string> hosts_;
  std::vector<std::vector<std::uint32_t>> addresses_;  // per rank, network byte order, the ones to ask on
  std::vector<std::uint16_t> ports_;
  std::string problem_;  // empty: every rank has its channel
  DumpRequest on_request_;
  std::thread thread_;
};

}  // namespace fsdpp
