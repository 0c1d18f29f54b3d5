#include "os/posix/signals.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>

#include "os/ids.hpp"
#include "os/job_control.hpp"

namespace looplock::sys {

namespace {

constexpr int kEndingSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// PID 1 of a pid namespace only receives signals it has a handler for; this
// one ends a wait the way the default action ends it anywhere else (tini
// exits 128+N too). Async-signal-safe: it only calls _exit(2).
void end_as_pid1(int sig) { _exit(128 + sig); }

struct sigaction action(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  return sa;
}

bool change(InheritedSignals& in, int sig, const struct sigaction& to) {
  struct sigaction old {};
  if (sigaction(sig, &to, &old) != 0) return false;
  in.actions.emplace_back(sig, old);
  return true;
}

// What failed, with the errno it failed with (read before anything else).
Failure failed(std::string what, int err) { return {.what = std::move(what), .err = err}; }

}  // namespace

// Seven system calls, each for the command's sake or for looplock's while it
// holds the lock: the mask read (the command gets it back), RLIMIT_CORE read
// and lowered, three dispositions set, and the signals that end a wait
// unblocked (the header says why each).
std::variant<InheritedSignals, Failure> take_signal_control(Pid self) {
  InheritedSignals in;
  if (sigprocmask(SIG_SETMASK, nullptr, &in.mask) != 0) return failed("cannot read the signal mask", errno);
  // Never a core file of looplock's own (a QUIT that ends a wait, an ABRT
  // sent to a waiting looplock): the soft limit goes to 0, the hard one stays
  // so that the command gets the inherited limit back.
  if (getrlimit(RLIMIT_CORE, &in.core) == 0) {
    struct rlimit none {
      0, in.core.rlim_max
    };
    in.core_known = setrlimit(RLIMIT_CORE, &none) == 0;
  }
  auto set = [&](int sig, const struct sigaction& to) {
    if (change(in, sig, to)) return std::optional<Failure>();
    const int err = errno;
    return std::optional(failed("cannot set up signal handling (sigaction " + std::to_string(sig) + ")", err));
  };
  for (const auto& [sig, to] : {std::pair{SIGCHLD, action(SIG_DFL)}, std::pair{SIGPIPE, action(SIG_IGN)},
                                std::pair{SIGXFSZ, action(SIG_IGN)}}) {
    if (auto f = set(sig, to)) return *f;
  }
  if (self == 1) {
    for (int s : kEndingSignals) {
      struct sigaction now {};
      if (sigaction(s, nullptr, &now) != 0 || now.sa_handler != SIG_DFL) continue;
      if (auto f = set(s, action(end_as_pid1))) return *f;
    }
  }
  sigset_t ending;
  sigemptyset(&ending);
  for (int s : kEndingSignals) sigaddset(&ending, s);
  if (sigprocmask(SIG_UNBLOCK, &ending, nullptr) != 0)
    return failed("cannot unblock the signals that end a wait", errno);
  return in;
}

bool restore_in_child(const InheritedSignals& inherited) {
  for (const auto& [sig, act] : inherited.actions) sigaction(sig, &act, nullptr);
  if (inherited.core_known) setrlimit(RLIMIT_CORE, &inherited.core);
  return sigprocmask(SIG_SETMASK, &inherited.mask, nullptr) == 0;
}

sigset_t supervised_signals() {
  sigset_t set;
  sigfillset(&set);
  sigdelset(&set, SIGKILL);
  sigdelset(&set, SIGSTOP);
  return set;
}

void exit_like(int wait_status, int exit_status) {
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    // Die of the same signal, so the caller sees what it would see without
    // looplock; but never leave a core file of looplock's own.
    struct rlimit no_core {
      0, 0
    };
    setrlimit(RLIMIT_CORE, &no_core);
    struct sigaction dfl = action(SIG_DFL);
    sigaction(sig, &dfl, nullptr);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, nullptr);
    raise(sig);  // returns only where it cannot kill: as PID 1 of a pid namespace
  }
  _exit(exit_status);
}

bool stop_self(int sig) {
  struct sigaction old {};
  if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) return false;
  // SIGCONT stays blocked while the command runs: if it continues looplock,
  // it is pending afterwards. One that is pending already came after the
  // job stopped: the job is to go on, so looplock need not stop at all.
  sigset_t cont;
  sigemptyset(&cont);
  sigaddset(&cont, SIGCONT);
  auto take_cont = [&] {
    timespec zero{};
    int r;
    do {
      r = sigtimedwait(&cont, nullptr, &zero);
    } while (r < 0 && errno == EINTR);
    return r == SIGCONT;
  };
  if (take_cont()) return true;
  struct sigaction dfl = action(SIG_DFL);
  sigaction(sig, &dfl, nullptr);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  // Pending while blocked; unblocking delivers it: looplock stops here until
  // a SIGCONT, unless the kernel discards it (orphaned process group).
  kill(getpid(), sig);
  sigprocmask(SIG_UNBLOCK, &one, nullptr);
  sigprocmask(SIG_BLOCK, &one, nullptr);
  sigaction(sig, &old, nullptr);
  return take_cont();
}

}  // namespace looplock::sys
