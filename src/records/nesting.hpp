// Nesting: a looplock whose command (directly or further down) starts another
// looplock on the same lock must not wait for itself. The outer looplock
// exports LOOPLOCK_HOLDER_PID and LOOPLOCK_HOLDER_FD (and, without -o,
// LOOPLOCK_FD); the inner one runs at once only when the kernel confirms that
// it is inside the critical section, so a forged or stale environment never
// bypasses the lock:
// - its own descriptor (the number in LOOPLOCK_HOLDER_FD or LOOPLOCK_FD),
//   inherited from the outer looplock, is this very lock file and the lock is
//   held through it: then this process is a holder already. Checked through
//   /proc/self/fdinfo, or, where /proc cannot be read (a mount namespace
//   without it, a pid namespace without its own), with non-blocking flock(2)
//   calls that change nothing when the lock is held (see holds_through());
// - or, for a command that closed the descriptor (Python's subprocess does),
//   LOOPLOCK_HOLDER_PID is a live ancestor whose descriptor holds the lock,
//   as /proc/PID/fdinfo reports: this needs /proc of this pid namespace.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/environment.hpp"
#include "os/file_status.hpp"
#include "os/ids.hpp"

namespace looplock {

struct OuterHolder {
  Pid pid;         // the outer looplock, as the environment names it (0 if it does not)
  int fd;          // the descriptor through which the lock is held
  bool inherited;  // the descriptor is this process's own
  bool hold = false;  // a hold across steps that $LOOPLOCK_HOLD names (fd: the hold's, handed over; -1 if none)
  // A hold's exports for the command (its cluster lock's key, lease, token).
  std::vector<std::pair<std::string_view, std::string>> exports = {};
  std::string hold_ends_at = {};  // a hold's: when its --max-time ends it (its record's ends_at)
  int hold_conn = -1;             // a hold's: the connection to its sentinel, open while this run runs
};

// The outer holder of the lock file `lock_file` (found in DIR, open as
// `dirfd`), if the environment names one that really holds it (exclusively,
// when `exclusive`) on behalf of this process `self`.
std::optional<OuterHolder> find_outer_holder(const EnvList& env, int dirfd, const sys::FileStatus& lock_file,
                                             bool exclusive, Pid self);

// Whether the lock on `lock_file` is held through this process's descriptor
// `fd` (exclusively, when `exclusive`): from /proc/self/fdinfo, else by
// probing (a fresh shared attempt on a new descriptor from `dirfd`, then an
// exclusive attempt on `fd`, which is a no-op when `fd` holds the lock and
// fails without effect when another does).
bool holds_through(int fd, int dirfd, const sys::FileStatus& lock_file, bool exclusive);
// The probe alone (exposed for tests): true only when `fd` holds the lock
// exclusively.
bool probe_holds_through(int fd, int dirfd, const sys::FileStatus& lock_file);

// Whether the looplock that set an inherited LOOPLOCK_DEADLINE (named by
// LOOPLOCK_DEADLINE_OWNER) is this process `self` or a live ancestor with
// the same start time: only then does its deadline hold. A copied, stale or
// unowned deadline does not (and without /proc of this pid namespace it
// cannot be told, so it does not either).
bool deadline_owner_lives(const EnvList& env, Pid self);

// The fd named by $LOOPLOCK_FD, if this process has it open on `lock_file`.
std::optional<int> inherited_lock_fd(const EnvList& env, const sys::FileStatus& lock_file);

}  // namespace looplock
