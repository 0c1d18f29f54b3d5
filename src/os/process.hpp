// A process on this host, told apart from any later one that gets its pid:
// its pid and its start time (text the system gives, the same for the same
// process), the boot it ran in and its pid namespace. posix/process.cpp
// reads them from /proc (posix/procfs.hpp); windows/process.cpp asks the
// kernel for the process's creation time and has no boot id, so nothing is
// ever proven dead there.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "os/ids.hpp"

namespace looplock::sys {

// The start time of process `pid` (posix/: field 22 of /proc/PID/stat, in
// clock ticks after boot; windows/: its creation time, in 100 ns units since
// 1601); nullopt when it cannot be read or there is no such process.
std::optional<std::string> process_start(Pid pid);
// This process's, in the same form. On POSIX it reads /proc/self, so it is
// right even when /proc belongs to another pid namespace.
std::optional<std::string> own_start();

// Whether a process with this pid exists and has not ended: a zombie (ended,
// its status not yet read by its parent) is not alive. posix/: kill(pid, 0),
// EPERM counting as alive, then its state in /proc/PID/stat when /proc
// shows this process's pid namespace.
bool process_alive(Pid pid);

// This boot's id (posix/: /proc/sys/kernel/random/boot_id) and this
// process's pid namespace (posix/: the inode of /proc/self/ns/pid, as
// text): with a pid and its start time they tell a process on this host
// apart from every other. Empty when the system cannot say (windows/:
// always).
std::string boot_id();
std::string pid_namespace();

// Whether the process (pid, its start time, the boot and the pid namespace it
// ran in, as a record of it says) is proven dead: it ran on this boot in this
// process's pid namespace, and its pid is gone or now another process. A
// record without those facts, or from elsewhere, never is.
bool proven_dead(const std::string& boot, const std::string& pid_ns, long long pid, const std::string& start);

// The descendants of this process `self` (children, their children, ...):
// posix/: from /proc/PID/task/TID/children; windows/: none (no command there
// inherits a lock's handle, which is what they are asked about).
std::vector<Pid> descendants(Pid self);
// Whether process `pid` is ending: gone, a zombie, or exiting in the kernel
// (closing its files), or, when `group` is not 0, in that process group
// (one looplock has signalled). posix/: /proc/PID/stat.
bool process_ending(Pid pid, Pid group);

// Whether `pid` is `self` or one of its ancestors (posix/: parents from
// /proc/PID/stat; windows/: only `self` itself is known).
bool is_self_or_ancestor(Pid pid, Pid self);
// Whether the pids the system lists (posix/: /proc) name the processes this
// process's own pids do: /proc shows its own pid namespace.
bool pids_comparable();

// Whether this process runs in a pid namespace other than the initial one
// (posix/: /proc/self/ns/pid; windows/: never): the system's lock table then
// leaves out holders outside it.
bool in_child_pid_namespace();
// The pid of `pid` in each pid namespace from /proc's down to its own
// (posix/: NSpid in /proc/PID/status; 0 is this process): one entry for a
// process in /proc's own namespace; empty when it cannot be read (windows/:
// always).
std::vector<Pid> namespace_pids(Pid pid);

// What the system tells about another process (--inspect's waiters), each
// nullopt when it cannot say (another user's process, /proc mounted with
// hidepid, or a system without the fact):
// - its name: the executable's base name (posix/: /proc/PID/comm, at most 15
//   bytes; windows/: without ".exe");
std::optional<std::string> process_name(Pid pid);
// - how long ago it started, in ms;
std::optional<long long> process_age_ms(Pid pid);
// - its arguments and its environment entry NAME (posix/: /proc/PID/cmdline
//   and /proc/PID/environ; windows/: never, Windows documents no way to read
//   another process's);
std::optional<std::vector<std::string>> process_args(Pid pid);
std::optional<std::string> process_env(Pid pid, std::string_view name);
// - its real user id (posix/: /proc/PID/status; windows/: never, users
//   have no number there).
std::optional<Uid> process_uid(Pid pid);
// - its groups: real, effective and supplementary (posix/: /proc/PID/status;
//   windows/: never).
std::optional<std::vector<Gid>> process_groups(Pid pid);

}  // namespace looplock::sys
