// lock_holders.hpp on Linux: what /proc says (procfs.hpp).
#include "os/lock_holders.hpp"

#include <algorithm>
#include <string>

#include "os/posix/procfs.hpp"
#include "os/sys.hpp"

namespace looplock::sys {

namespace {

// `locks` (as /proc/locks names them) confirmed through descriptors.
std::vector<KernelLock> confirm(const std::vector<KernelLock>& locks, const FileStatus& file) {
  if (locks.empty()) return {};
  std::vector<Pid> pids;
  for (const auto& k : locks) pids.push_back(k.pid);
  auto confirmed = procfs::fd_holders(pids, file);
  if (confirmed.size() == locks.size()) return confirmed;
  // A pid /proc/locks names no longer holds the lock itself: it exited (or
  // closed its descriptor) after passing the descriptor on, and the kernel
  // still names it. Whoever has the descriptor now holds the lock.
  auto found = procfs::fd_holders(procfs::all_pids(), file);
  if (found.empty()) return locks;
  for (auto& k : found) {
    for (const auto& l : locks) {
      if (l.pid != k.pid &&
          std::none_of(confirmed.begin(), confirmed.end(), [&](const KernelLock& c) { return c.pid == l.pid; })) {
        k.locked_by = l.pid;
      }
    }
  }
  return found;
}

}  // namespace

std::optional<LockTable> lock_table(const FileStatus& file) {
  auto table = procfs::lock_table(file);
  if (!table) return std::nullopt;
  return LockTable{.holders = confirm(table->holders, file), .waiters = std::move(table->waiters)};
}

std::vector<KernelLock> holders_among(const std::vector<Pid>& pids, const FileStatus& file) {
  return procfs::fd_holders(pids, file);
}

std::vector<Pid> holding_lock(const std::vector<Pid>& pids, const FileStatus& file) {
  return procfs::pids_holding_flock(pids, file);
}

std::optional<bool> own_fd_holds_lock(int fd, const FileStatus& file, bool exclusive) {
  const auto info = read_file("/proc/self/fdinfo/" + std::to_string(fd), 1 << 20);
  if (!info) return std::nullopt;
  return procfs::parse_fdinfo_holds(*info, file, exclusive);
}

bool fd_holds_lock(Pid pid, int fd, const FileStatus& file, bool exclusive) {
  return procfs::fd_holds_flock(pid, fd, file, exclusive);
}

}  // namespace looplock::sys
