// signal_names.hpp on POSIX (Linux's signals).
#include "os/signal_names.hpp"

#include <csignal>

namespace looplock {

namespace {
struct Named {
  const char* name;
  int sig;
};
constexpr Named kNames[] = {
    {"HUP", SIGHUP},       {"INT", SIGINT},   {"QUIT", SIGQUIT},   {"ILL", SIGILL},   {"TRAP", SIGTRAP},
    {"ABRT", SIGABRT},     {"BUS", SIGBUS},   {"FPE", SIGFPE},     {"KILL", SIGKILL}, {"USR1", SIGUSR1},
    {"SEGV", SIGSEGV},     {"USR2", SIGUSR2}, {"PIPE", SIGPIPE},   {"ALRM", SIGALRM}, {"TERM", SIGTERM},
    {"STKFLT", SIGSTKFLT}, {"CHLD", SIGCHLD}, {"CONT", SIGCONT},   {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},
    {"TTIN", SIGTTIN},     {"TTOU", SIGTTOU}, {"URG", SIGURG},     {"XCPU", SIGXCPU}, {"XFSZ", SIGXFSZ},
    {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"IO", SIGIO},     {"PWR", SIGPWR},
    {"SYS", SIGSYS},
};
}  // namespace

std::optional<int> parse_signal(std::string_view text) {
  std::string t;
  for (char c : text) t += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  if (t.starts_with("SIG")) t.erase(0, 3);
  if (!t.empty() && t.find_first_not_of("0123456789") == std::string::npos && t.size() < 4) {
    const int n = std::stoi(t);
    return n >= 1 && n <= SIGRTMAX ? std::optional<int>(n) : std::nullopt;
  }
  for (const auto& n : kNames) {
    if (t == n.name) return n.sig;
  }
  if (t.starts_with("RTMIN+") && t.size() > 6 && t.size() < 9 &&
      t.find_first_not_of("0123456789", 6) == std::string::npos) {
    const int n = SIGRTMIN + std::stoi(t.substr(6));
    return n <= SIGRTMAX ? std::optional<int>(n) : std::nullopt;
  }
  return std::nullopt;
}

std::string signal_name(int sig) {
  for (const auto& n : kNames) {
    if (n.sig == sig) return n.name;
  }
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) return "RTMIN+" + std::to_string(sig - SIGRTMIN);
  return std::to_string(sig);
}

}  // namespace looplock
