// What Linux's /proc says about processes and locks: start times (to tell a
// reused pid), ancestry (for nesting) and flock(2) holders (/proc/locks and
// /proc/PID/fdinfo). Every reader tolerates missing or odd content.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "os/file_status.hpp"
#include "os/ids.hpp"
#include "os/lock_holders.hpp"

namespace looplock::procfs {

// Field 22 of /proc/PID/stat (start time in clock ticks after boot), as text.
std::optional<std::string> pid_start(Pid pid);
// Parses the start time out of /proc/PID/stat content (exposed for tests).
std::optional<std::string> parse_stat_start(std::string_view stat);
// The start time as the initial time namespace shows it: /proc shows each
// start time shifted by the reader's time namespace's boottime offset
// (/proc/self/timens_offsets; none outside one), so that a looplock in one
// (unshare --time) would read a live holder's as another's. `raw` is
// pid_start()'s; `offsets` that file's content, `hz` clock ticks a second.
std::optional<std::string> start_in_initial_time_ns(const std::optional<std::string>& raw, std::string_view offsets,
                                                    long hz);
// Parent pid from /proc/PID/stat.
std::optional<Pid> parent_pid(Pid pid);
std::optional<Pid> parse_stat_ppid(std::string_view stat);

// State, process group and flags from /proc/PID/stat (fields 3, 5 and 9).
struct ProcStat {
  char state = '?';  // R, S, D, Z, X, ...
  Pid pgrp = 0;
  unsigned long flags = 0;  // the kernel's PF_* flags
  // Exiting: a zombie, dead, or PF_EXITING set (it is closing its files).
  bool exiting() const { return state == 'Z' || state == 'X' || (flags & 0x4) != 0; }
};
std::optional<ProcStat> proc_stat(Pid pid);
std::optional<ProcStat> parse_proc_stat(std::string_view stat);

// How a process treats signals: the masks of /proc/PID/status (bit N-1 for
// signal N): blocked (by its main thread), ignored, caught (a handler).
struct SignalMasks {
  unsigned long long blocked = 0, ignored = 0, caught = 0;
  bool catches(int sig) const { return sig >= 1 && sig <= 64 && ((caught >> (sig - 1)) & 1ULL) != 0; }
};
std::optional<SignalMasks> signal_masks(Pid pid);
std::optional<SignalMasks> parse_signal_masks(std::string_view status);

// Whether `pid` is `self` or one of its ancestors.
bool is_self_or_ancestor(Pid pid, Pid self);

// Whether a process with this pid exists (kill(pid, 0); EPERM counts as alive).
bool pid_alive(Pid pid);
// Whether process `pid` has ended, its status not yet read (a zombie whose
// every thread has ended; one whose main thread alone ended lives on).
bool ended(Pid pid);

// Whether /proc shows this process's own pid namespace (/proc/self is its
// pid): only then do pids from /proc and from getpid() name the same
// processes.
bool proc_is_ours();

// The pid of `pid` in each pid namespace from /proc's down to its own
// (NSpid in /proc/PID/status: one entry outside any child namespace); pid
// 0 is this process (/proc/self).
std::vector<Pid> ns_pids(Pid pid);
std::vector<Pid> parse_ns_pids(std::string_view status);

// The process's name (/proc/PID/comm: the executable's base name, at most
// 15 bytes), or nullopt.
std::optional<std::string> comm(Pid pid);

// The flock(2) locks that /proc/locks reports on this inode (waiters
// excluded); nullopt, with errno set, when /proc/locks cannot be read. Its
// pid is the process that took the lock, which may have exited since,
// passing the descriptor on; a holder outside /proc's pid namespace is not
// listed at all.
std::optional<std::vector<sys::KernelLock>> flock_holders(const sys::FileStatus& file);
std::vector<sys::KernelLock> parse_proc_locks(std::string_view content, const sys::FileStatus& file);
// Holders and the blocked requests ("->" lines: processes waiting in
// flock(2)) on this inode, from one read of /proc/locks.
struct LockTable {
  std::vector<sys::KernelLock> holders;
  std::vector<sys::KernelLock> waiters;
};
std::optional<LockTable> lock_table(const sys::FileStatus& file);
LockTable parse_lock_table(std::string_view content, const sys::FileStatus& file);

// How long ago the process started, in ms (from its start time and
// /proc/uptime), or nullopt.
std::optional<long long> age_ms(Pid pid);
// Its arguments (/proc/PID/cmdline), its environment entry NAME
// (/proc/PID/environ), its real uid (/proc/PID/status): nullopt when they
// cannot be read (another user's process, hidepid).
std::optional<std::vector<std::string>> cmdline(Pid pid);
std::optional<std::string> environ_get(Pid pid, std::string_view name);
std::optional<Uid> real_uid(Pid pid);
// Its groups: real, effective and supplementary (/proc/PID/status, Gid: and
// Groups:); nullopt when they cannot be read.
std::optional<std::vector<Gid>> group_ids(Pid pid);
std::vector<Gid> parse_group_ids(std::string_view status);

// Whether the open file description behind /proc/PID/fd/FD is `file` and holds a
// flock(2) lock on it (exclusive, or either kind when `exclusive` is false).
bool fd_holds_flock(Pid pid, int fd, const sys::FileStatus& file, bool exclusive);
bool parse_fdinfo_holds(std::string_view fdinfo, const sys::FileStatus& file, bool exclusive);

// The descendants of `pid` (children, their children, ...), from
// /proc/PID/task/TID/children; `pid` is looplock itself, whose one thread
// has its pid as tid (no listing of its task directory).
std::vector<Pid> descendants(Pid pid);

// Every pid in /proc.
std::vector<Pid> all_pids();

// Those of `pids` that have an fd on `file` whose open file description
// holds a flock(2) lock on it, with the lock's mode.
std::vector<sys::KernelLock> fd_holders(const std::vector<Pid>& pids, const sys::FileStatus& file);
// The same, pids only.
std::vector<Pid> pids_holding_flock(const std::vector<Pid>& pids, const sys::FileStatus& file);

}  // namespace looplock::procfs
