// What Linux's /proc says about processes and locks: start times (to tell a
// reused pid), ancestry (for nesting) and flock(2) holders (/proc/locks and
// /proc/PID/fdinfo). Every reader tolerates missing or odd content.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace looplock::procfs {

// Field 22 of /proc/PID/stat (start time in clock ticks after boot), as text.
std::optional<std::string> pid_start(pid_t pid);
// Parses the start time out of /proc/PID/stat content (exposed for tests).
std::optional<std::string> parse_stat_start(std::string_view stat);
// Parent pid from /proc/PID/stat.
std::optional<pid_t> parent_pid(pid_t pid);
std::optional<pid_t> parse_stat_ppid(std::string_view stat);

// Whether `pid` is `self` or one of its ancestors.
bool is_self_or_ancestor(pid_t pid, pid_t self);

// Whether a process with this pid exists (kill(pid, 0); EPERM counts as alive).
bool pid_alive(pid_t pid);

struct KernelLock {
  pid_t pid = 0;
  bool exclusive = true;
};
// The flock(2) locks that /proc/locks reports on this inode (waiters excluded).
std::vector<KernelLock> flock_holders(const struct stat& file);
std::vector<KernelLock> parse_proc_locks(std::string_view content, const struct stat& file);

// Whether the open file description behind /proc/PID/fd/FD is `file` and holds a
// flock(2) lock on it (exclusive, or either kind when `exclusive` is false).
bool fd_holds_flock(pid_t pid, int fd, const struct stat& file, bool exclusive);
bool parse_fdinfo_holds(std::string_view fdinfo, const struct stat& file, bool exclusive);

// The descendants of `pid` (children, their children, ...), from
// /proc/PID/task/TID/children.
std::vector<pid_t> descendants(pid_t pid);

// Every pid in /proc.
std::vector<pid_t> all_pids();

// Those of `pids` that have an fd on `file` whose open file description
// holds a flock(2) lock on it.
std::vector<pid_t> pids_holding_flock(const std::vector<pid_t>& pids, const struct stat& file);

}  // namespace looplock::procfs
