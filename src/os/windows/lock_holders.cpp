// lock_holders.hpp on Windows, which names no process holding or waiting
// for a lock.
#include "os/lock_holders.hpp"

#include <cerrno>

namespace looplock::sys {

std::optional<LockTable> lock_table(const FileStatus&) {
  errno = ENOSYS;
  return std::nullopt;
}

std::vector<KernelLock> holders_among(const std::vector<Pid>&, const FileStatus&) { return {}; }

std::vector<Pid> holding_lock(const std::vector<Pid>&, const FileStatus&) { return {}; }

std::optional<bool> own_fd_holds_lock(int, const FileStatus&, bool) { return std::nullopt; }

bool fd_holds_lock(Pid, int, const FileStatus&, bool) { return false; }

}  // namespace looplock::sys
