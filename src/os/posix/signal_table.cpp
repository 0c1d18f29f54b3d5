// signal_table.hpp on POSIX: Linux's signals, and its real-time ones.
#include "os/signal_table.hpp"

#include <csignal>

namespace looplock::signal_table {

namespace {
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

std::span<const Named> named() { return kNames; }

bool valid(int sig) { return sig >= 1 && sig <= SIGRTMAX; }

std::optional<int> realtime(int n) {
  const int sig = SIGRTMIN + n;
  return sig <= SIGRTMAX ? std::optional<int>(sig) : std::nullopt;
}

std::optional<int> realtime_index(int sig) {
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) return sig - SIGRTMIN;
  return std::nullopt;
}

}  // namespace looplock::signal_table
