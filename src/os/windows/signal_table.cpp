// signal_table.hpp on Windows: the signals of the C runtime's <signal.h>
// (Microsoft documents these six, and raise and signal take no other); no
// real-time signals.
#include <csignal>

#include "os/signal_table.hpp"

namespace looplock::signal_table {

namespace {
constexpr Named kNames[] = {
    {"INT", SIGINT}, {"ILL", SIGILL}, {"FPE", SIGFPE}, {"SEGV", SIGSEGV}, {"TERM", SIGTERM}, {"ABRT", SIGABRT},
};
}  // namespace

std::span<const Named> named() { return kNames; }

bool valid(int sig) {
  for (const auto& n : kNames) {
    if (n.sig == sig) return true;
  }
  return false;
}

std::optional<int> realtime(int) { return std::nullopt; }

std::optional<int> realtime_index(int) { return std::nullopt; }

}  // namespace looplock::signal_table
