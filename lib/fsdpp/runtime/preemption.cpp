#include "fsdpp/runtime/preemption.hpp"

#include <csignal>

namespace fsdpp {
namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_preemption_signal(int signal) { g_signal = signal; }
}  // namespace

void install_preemption_handlers() {
  struct sigaction action {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // interrupted system calls resume: the flag is read at the next step boundary
  sigaction(SIGUSR1, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // Ctrl-C on a run without a launcher stops it as a preemption would; a second Ctrl-C kills it as usual.
  action.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGINT, &action, nullptr);
}

int preemption_signal() { return static_cast<int>(g_signal); }

}  // namespace fsdpp
