// signal_names.hpp on Windows: the signals of the C runtime's <signal.h>
// (Microsoft documents these six, and raise(3) and signal(3) take no other).
#include <csignal>

#include "os/signal_names.hpp"

namespace looplock {

namespace {
struct Named {
  const char* name;
  int sig;
};
constexpr Named kNames[] = {
    {"INT", SIGINT}, {"ILL", SIGILL}, {"FPE", SIGFPE}, {"SEGV", SIGSEGV}, {"TERM", SIGTERM}, {"ABRT", SIGABRT},
};
}  // namespace

std::optional<int> parse_signal(std::string_view text) {
  std::string t;
  for (char c : text) t += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  if (t.starts_with("SIG")) t.erase(0, 3);
  for (const auto& n : kNames) {
    if (t == n.name || t == std::to_string(n.sig)) return n.sig;
  }
  return std::nullopt;
}

std::string signal_name(int sig) {
  for (const auto& n : kNames) {
    if (n.sig == sig) return n.name;
  }
  return std::to_string(sig);
}

}  // namespace looplock
