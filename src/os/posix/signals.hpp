// looplock's own signal state on POSIX: what it inherited (and gives back to
// the command), what it changes for itself, and how it leaves the way the
// command left. Signals are handled in ordinary code: while the command runs
// every catchable signal is blocked and taken with sigtimedwait
// (job_control.cpp);
// while looplock waits for the lock, INT, TERM, HUP and QUIT keep their
// default action and simply end looplock. The one exception is PID 1 of a pid
// namespace, which the kernel never kills with a signal at its default
// action: there a handler ends the wait (see take_signal_control).
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <utility>
#include <variant>
#include <vector>

#include "os/ids.hpp"
#include "os/job_control.hpp"

namespace looplock::sys {

// The signal mask, the dispositions looplock changes and its core-file
// limit, as looplock was started with them.
struct InheritedSignals {
  sigset_t mask{};
  std::vector<std::pair<int, struct sigaction>> actions;  // (signal, as inherited)
  struct rlimit core {};
  bool core_known = false;
};

// Captures the inherited state, then sets looplock's own:
// - no core file of looplock's own, ever (RLIMIT_CORE 0; the command gets
//   the inherited limit back);
// - SIGCHLD at its default, so the command can be waited for even when the
//   caller ignored it;
// - SIGPIPE and SIGXFSZ ignored: a closed stderr or a file-size limit must not
//   kill looplock while it holds the lock (writes fail with EPIPE or EFBIG);
// - INT, TERM, HUP and QUIT unblocked, so that they end a wait; as PID 1 (a
//   container's entrypoint), where a signal at its default action is never
//   delivered, they get a handler that ends looplock with 128+N, as tini does.
//   A signal the caller ignored stays ignored.
// `self` is looplock's pid (1: the entrypoint of a pid namespace). What
// failed, when the signal state cannot be set.
std::variant<InheritedSignals, Failure> take_signal_control(Pid self);

// Puts back what the command must start with: the inherited dispositions,
// core-file limit and mask. Async-signal-safe (it runs between vfork and
// exec); returns false (errno set) when the mask cannot be restored.
bool restore_in_child(const InheritedSignals& inherited);

// Every signal looplock takes while the command runs: all but KILL and STOP.
sigset_t supervised_signals();

// Stops looplock with `sig` (TSTP, TTIN or TTOU) at its default action,
// as the job it runs was stopped, so that the shell above sees looplock
// stopped. Returns whether looplock was really stopped and has been
// continued since (SIGCONT is then taken), or false when the kernel
// discarded the stop (looplock's process group is orphaned: no job control
// above it) or the caller had the signal ignored.
bool stop_self(int sig);

}  // namespace looplock::sys
