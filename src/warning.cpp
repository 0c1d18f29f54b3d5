#include "warning.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>

#include "procfs.hpp"
#include "unique_fd.hpp"

namespace looplock {

bool signal_in_group(pid_t pid, pid_t pgid, int sig) {
  auto in_group = [&] {
    const auto st = procfs::proc_stat(pid);
    return st && st->pgrp == pgid && !st->exiting();
  };
  UniqueFd fd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  if (!fd) {
    if (errno != ENOSYS) return false;  // gone already
    return in_group() && kill(pid, sig) == 0;
  }
  // The pidfd names this very process: if the pid was reused since, it has
  // exited, and the send fails.
  return in_group() && syscall(SYS_pidfd_send_signal, fd.get(), sig, nullptr, 0) == 0;
}

bool JobWarning::pass() {
  if (!procfs::proc_is_ours()) return false;
  for (const pid_t pid : procfs::descendants(self_)) {
    if (std::find(sent_.begin(), sent_.end(), pid) != sent_.end()) continue;
    const auto st = procfs::proc_stat(pid);
    if (!st || st->pgrp != pgid_ || st->exiting()) continue;
    if (std::find(seen_.begin(), seen_.end(), pid) == seen_.end()) seen_.push_back(pid);
    const auto masks = procfs::signal_masks(pid);
    if (!masks || !masks->catches(sig_)) continue;
    if (signal_in_group(pid, pgid_, sig_)) sent_.push_back(pid);
  }
  return true;
}

std::vector<pid_t> JobWarning::skipped() const {
  std::vector<pid_t> out;
  for (const pid_t p : seen_) {
    if (std::find(sent_.begin(), sent_.end(), p) == sent_.end()) out.push_back(p);
  }
  return out;
}

}  // namespace looplock
