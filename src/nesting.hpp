// Nesting: a looplock whose command (directly or further down) starts another
// looplock on the same lock must not wait for itself. The outer looplock
// exports LOOPLOCK_HOLDER_PID and LOOPLOCK_HOLDER_FD; the inner one trusts
// them only when that pid is itself or a live ancestor whose fd is this very
// lock file and holds the flock(2) lock on it (/proc/PID/fdinfo), so a forged
// or stale environment never bypasses the lock.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <optional>

#include "environment.hpp"

namespace looplock {

struct OuterHolder {
  pid_t pid;
  int fd;
};

// The holder named by the environment, if it really holds `lock_file`'s lock
// (exclusively, when `exclusive`) and is `self` or an ancestor of it.
std::optional<OuterHolder> find_outer_holder(const EnvList& env, const struct stat& lock_file, bool exclusive,
                                             pid_t self);

// The fd named by $LOOPLOCK_FD, if this process has it open on `lock_file`.
std::optional<int> inherited_lock_fd(const EnvList& env, const struct stat& lock_file);

}  // namespace looplock
