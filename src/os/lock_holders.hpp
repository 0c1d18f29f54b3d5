// Who holds a lock on a file, as the system reports it. Linux can say
// (/proc/locks and /proc/PID/fdinfo: posix/procfs.hpp); Windows cannot, so
// there the answer is always "not known".
#pragma once

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

// Those of `pids` that hold a lock on `file` through a descriptor of their
// own (posix/: /proc/PID/fdinfo; windows/: none can be told).
std::vector<Pid> holding_lock(const std::vector<Pid>& pids, const FileStatus& file);

}  // namespace looplock::sys
