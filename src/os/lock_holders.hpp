// Who holds a lock on a file, and who waits for it, as the system reports
// them. Linux can say (/proc/locks, confirmed through /proc/PID/fdinfo:
// posix/lock_holders.cpp over procfs.hpp); Windows cannot, so there every
// table is unreadable (ENOSYS) and no process is named.
#pragma once

#include <optional>
#include <vector>

#include "os/file_status.hpp"
#include "os/ids.hpp"

namespace looplock::sys {

// A lock the kernel shows on a file.
struct KernelLock {
  Pid pid = 0;
  bool exclusive = true;
  // When `pid` holds the lock through a descriptor another process took it
  // on (and passed on): that process, as /proc/locks still names it; else 0.
  Pid locked_by = 0;
};

// The locks on `file`: its holders, each confirmed through its descriptors,
// and the processes waiting for it. nullopt (errno set) when the system's
// table cannot be read. On Linux /proc/locks names the process that took a
// lock, which may have exited since, passing the descriptor on: whoever has
// the descriptor now is then found among all processes, its `locked_by`
// naming the process that took it.
struct LockTable {
  std::vector<KernelLock> holders;
  std::vector<KernelLock> waiters;
};
std::optional<LockTable> lock_table(const FileStatus& file);

// Those of `pids` that hold a lock on `file` through a descriptor of their
// own, with the lock's mode; the pids alone.
std::vector<KernelLock> holders_among(const std::vector<Pid>& pids, const FileStatus& file);
std::vector<Pid> holding_lock(const std::vector<Pid>& pids, const FileStatus& file);

// Whether this process's descriptor `fd` (open on `file`) holds a lock on it
// (exclusive, or either kind when `exclusive` is false): nullopt when the
// system cannot say (posix/: /proc/self/fdinfo cannot be read; windows/:
// never can).
std::optional<bool> own_fd_holds_lock(int fd, const FileStatus& file, bool exclusive);
// Whether descriptor `fd` of process `pid` is open on `file` and holds a
// lock on it, the same way; false when that cannot be read.
bool fd_holds_lock(Pid pid, int fd, const FileStatus& file, bool exclusive);

}  // namespace looplock::sys
