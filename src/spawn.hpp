// Running the command: the signal state looplock inherited (restored in the
// command), fork/exec with the lock fd passed on purpose, signal forwarding in
// ordinary code (blocked signals + sigtimedwait, as tini and dumb-init do),
// and leaving the way the command left.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "log.hpp"

namespace looplock {

// The signal mask and the dispositions looplock changes for itself, as it
// was started with them.
struct InheritedSignals {
  sigset_t mask{};
  struct sigaction chld {};
  struct sigaction pipe {};
  struct sigaction xfsz {};
};

// Captures the inherited signal state, then sets looplock's own: SIGCHLD at
// its default (so the command can be waited for even when the caller ignored
// it), SIGPIPE and SIGXFSZ ignored (a closed stderr or a file-size limit
// must not kill looplock while it holds the lock: writes fail with EPIPE or
// EFBIG instead), and INT, TERM, HUP, QUIT unblocked (they end a wait).
InheritedSignals take_signal_control();

// HUP INT QUIT TERM USR1 USR2 ALRM PIPE VTALRM PROF XCPU XFSZ and SIGRTMIN..SIGRTMAX.
sigset_t forwarded_signals();

struct CommandSpec {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // the whole environment, "NAME=value"
  int pass_fd = -1;              // an fd to leave open in the command, or -1
  std::optional<long long> kill_after_ns;
  // Called every tick_interval_ns while the command runs (from the signal
  // loop: signals that arrive meanwhile wait until it returns). When it
  // returns false (the etcd lease was lost), the command is sent TERM (its
  // process group when it has one of its own), then KILL after
  // tick_kill_after_ns, and tick is not called again.
  std::function<bool()> tick;
  long long tick_interval_ns = 0;
  long long tick_kill_after_ns = 5'000'000'000LL;
};

// Whether looplock is the foreground job of its controlling terminal. Only
// then does the command share looplock's process group (so that ^C and ^Z
// reach both, and job control works); otherwise it gets a process group of
// its own, so that a signal sent to looplock's whole group (timeout(1),
// `kill -- -PGID`) reaches it once, through looplock, not twice.
bool in_terminal_foreground();

// Forks and execs the command, forwards signals to it until it ends, and
// returns its wait status. Throws Fatal 71 if it cannot fork, 126/127 if the
// command cannot be executed (after reaping the child).
int run_command(const CommandSpec& spec, const InheritedSignals& inherited, const Logger& log);

// Replaces looplock with the command (-F). Returns only by throwing Fatal.
[[noreturn]] void exec_command(const CommandSpec& spec, const InheritedSignals& inherited);

// The exit status looplock reports for a wait status, when it does not die
// of the signal itself: N, or 128+S.
int shell_status(int wait_status);

// Exits with the command's status, or dies of the signal that killed it
// (without a core dump of looplock's own).
[[noreturn]] void exit_like(int wait_status);

// The status and message for an exec(2) errno: 127 when not found, else 126.
int exec_failure_status(int err);

}  // namespace looplock
