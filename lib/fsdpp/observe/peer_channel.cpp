#include "fsdpp/observe/peer_channel.hpp"

#include "fsdpp/runtime/error.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

namespace fsdpp {
namespace {

constexpr char kMagic[8] = {'f', 's', 'd', 'p', 'p', 'F', 'R', '1'};
enum Kind : std::uint8_t { kDumpRequest = 1, kDumped = 2 };

struct Message {
  char magic[8];
  std::uint64_t token;
  std::int32_t rank;  // the sender
  std::uint8_t kind;
  char reason[207];   // NUL-terminated, cut short
};

std::atomic<int> g_wake_fd{-1};  // the running channel's pipe, for the SIGUSR2 handler

Message make_message(std::uint64_t token, int rank, Kind kind, const std::string& reason) {
  Message m{};
  std::memcpy(m.magic, kMagic, sizeof kMagic);
  m.token = token;
  m.rank = rank;
  m.kind = kind;
  std::strncpy(m.reason, reason.c_str(), sizeof m.reason - 1);
  return m;
}

bool valid(const Message& m, ssize_t size, std::uint64_t token) {
  return size == static_cast<ssize_t>(sizeof m) && std::memcmp(m.magic, kMagic, sizeof kMagic) == 0 && m.token == token;
}

sockaddr_in address_of(std::uint32_t ipv4, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = ipv4;
  a.sin_port = htons(port);
  return a;
}

// A UDP socket on every interface, on a port the kernel picks.
int open_udp_socket(std::uint16_t& port) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  FSDPP_CHECK(fd >= 0, "flight recorder: cannot open a UDP socket: {}", std::strerror(errno));
  sockaddr_in any = address_of(htonl(INADDR_ANY), 0);
  socklen_t length = sizeof any;
  if (bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof any) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&any), &length) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    FSDPP_CHECK(false, "flight recorder: cannot bind a UDP socket: {}", why);
  }
  port = ntohs(any.sin_port);
  return fd;
}

// This host's IPv4 addresses other than loopback, on interfaces that are up.
std::vector<std::uint32_t> own_addresses(std::size_t at_most) {
  std::vector<std::uint32_t> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i && out.size() < at_most; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK))
      out.push_back(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
  freeifaddrs(list);
  return out;
}

}  // namespace

struct PeerChannel::Card {
  char host[64];
  std::uint16_t port;
  std::uint8_t count;
  std::uint32_t ipv4[8];
};

PeerChannel::PeerChannel(MPI_Comm world, const std::string& host, DumpRequest on_request)
    : on_request_(std::move(on_request)) {
  int size = 1;
  MPI_Comm_rank(world, &rank_);
  MPI_Comm_size(world, &size);
  // Nothing may throw before the all-gather below: every rank must reach it, whatever failed here.
  std::uint16_t port = 0;
  std::string problem;
  try {
    socket_ = open_udp_socket(port);
    FSDPP_CHECK(pipe2(pipe_, O_CLOEXEC) == 0, "flight recorder: cannot create a pipe: {}", std::strerror(errno));
  } catch (const std::exception& e) {
    problem = e.what();
  }

  Card mine{};
  std::strncpy(mine.host, host.c_str(), sizeof mine.host - 1);
  mine.port = problem.empty() ? port : 0;  // 0: no channel on this rank
  const std::vector<std::uint32_t> addresses = own_addresses(sizeof mine.ipv4 / sizeof mine.ipv4[0]);
  mine.count = static_cast<std::uint8_t>(addresses.size());
  std::copy(addresses.begin(), addresses.end(), mine.ipv4);
  std::vector<Card> cards(static_cast<std::size_t>(size));
  FSDPP_MPI_CHECK(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, cards.data(), sizeof mine, MPI_BYTE, world));
  if (rank_ == 0) token_ = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  FSDPP_MPI_CHECK(MPI_Bcast(&token_, 1, MPI_UINT64_T, 0, world));

  for (std::size_t r = 0; r < cards.size(); ++r) {
    const Card& card = cards[r];
    hosts_.emplace_back(card.host);
    ports_.push_back(card.port);
    if (card.port == 0 && problem_.empty()) {
      const bool mine_failed = r == static_cast<std::size_t>(rank_) && !problem.empty();
      problem_ = fmt::format("rank {} on {} has no side channel{}", r, hosts_.back(), mine_failed ? ": " + problem : "");
    }
    // A rank on this host answers on loopback; one elsewhere on its host's own addresses.
    if (hosts_.back() == host) addresses_.push_back({htonl(INADDR_LOOPBACK)});
    else addresses_.emplace_back(card.ipv4, card.ipv4 + card.count);
  }
  if (!usable()) {  // all or nothing: a rank that asks must be able to count on every answer
    release();
    return;
  }
  g_wake_fd = pipe_[1];
  thread_ = std::thread([this] { serve(); });
}

PeerChannel::~PeerChannel() {
  if (thread_.joinable()) {
    g_wake_fd = -1;
    const char quit = 'q';
    if (write(pipe_[1], &quit, 1) != 1) {}  // the thread ends at the next poll
    thread_.join();
  }
  release();
}

void PeerChannel::release() noexcept {
  for (int* fd : {&pipe_[0], &pipe_[1], &socket_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void PeerChannel::wake_from_signal() {
  const int fd = g_wake_fd.load();
  const char dump = 's';
  if (fd >= 0 && write(fd, &dump, 1) != 1) {}  // a full pipe already holds a wake-up
}

void PeerChannel::serve() {
  for (;;) {
    pollfd fds[2] = {{socket_, POLLIN, 0}, {pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents & POLLIN) {
      char command = 0;
      if (read(pipe_[0], &command, 1) == 1) {
        if (command == 'q') return;
        if (command == 's') on_request_(-1, "SIGUSR2");
      }
    }
    if (fds[0].revents & POLLIN) {
      Message m{};
      sockaddr_in from{};
      socklen_t length = sizeof from;
      const ssize_t got = recvfrom(socket_, &m, sizeof m, 0, reinterpret_cast<sockaddr*>(&from), &length);
      if (!valid(m, got, token_) || m.kind != kDumpRequest) continue;
      m.reason[sizeof m.reason - 1] = '\0';
      on_request_(m.rank, m.reason);  // dump first: an answer means the records are on disk
      const Message answer = make_message(token_, rank_, kDumped, "");
      sendto(socket_, &answer, sizeof answer, 0, reinterpret_cast<const sockaddr*>(&from), length);
    }
  }
}

std::optional<std::vector<int>> PeerChannel::ask_all_to_dump(const std::string& reason, double wait_s) const {
  if (!usable()) return std::nullopt;
  const int ranks = static_cast<int>(hosts_.size());
  std::vector<bool> answered(hosts_.size(), false);
  answered[static_cast<std::size_t>(rank_)] = true;
  std::uint16_t port = 0;
  int fd = -1;
  try {
    fd = open_udp_socket(port);  // its own socket: the answers must not reach the serving thread
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const Message request = make_message(token_, rank_, kDumpRequest, reason);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(wait_s));
  auto missing = [&] { return std::count(answered.begin(), answered.end(), false); };
  while (missing() > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < ranks; ++r) {
      if (answered[static_cast<std::size_t>(r)]) continue;
      for (std::uint32_t ipv4 : addresses_[static_cast<std::size_t>(r)]) {
        const sockaddr_in to = address_of(ipv4, ports_[static_cast<std::size_t>(r)]);
        sendto(fd, &request, sizeof request, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
      }
    }
    // Answers for 200 ms, then ask the silent ones again (a datagram may be lost).
    const auto round_end = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
    for (auto now = std::chrono::steady_clock::now(); now < round_end && missing() > 0; now = std::chrono::steady_clock::now()) {
      pollfd p{fd, POLLIN, 0};
      const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(round_end - now).count()) + 1;
      if (poll(&p, 1, ms) <= 0) continue;
      Message m{};
      const ssize_t got = recv(fd, &m, sizeof m, 0);
      if (valid(m, got, token_) && m.kind == kDumped && m.rank >= 0 && m.rank < ranks)
        answered[static_cast<std::size_t>(m.rank)] = true;
    }
  }
  close(fd);
  std::vector<int> silent;
  for (int r = 0; r < ranks; ++r)
    if (!answered[static_cast<std::size_t>(r)]) silent.push_back(r);
  return silent;
}

}  // namespace fsdpp
