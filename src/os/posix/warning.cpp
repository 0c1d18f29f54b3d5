#include "os/posix/warning.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>

#include "os/ids.hpp"
#include "os/posix/procfs.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"

namespace looplock::sys {

bool signal_in_group(Pid pid, Pid pgid, int sig) {
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

namespace {

struct Member {
  Pid pid;
  Pid ppid;
  Pid pgrp;
};

// The processes of the job: looplock's descendants in the job's process
// group, and in the job of a nested looplock among them (a looplock started
// by the command runs its own command in a group of its own, and would have
// passed a signal to its group on).
std::vector<Member> job_members(Pid self, Pid pgid) {
  std::vector<Member> all;
  for (const Pid pid : procfs::descendants(self)) {
    const auto text = sys::read_file("/proc/" + std::to_string(pid) + "/stat", 4096);
    if (!text) continue;
    const auto st = procfs::parse_proc_stat(*text);
    const auto ppid = procfs::parse_stat_ppid(*text);
    if (st && ppid && !st->exiting()) all.push_back({pid, *ppid, st->pgrp});
  }
  std::vector<Pid> groups{pgid};
  auto in_job = [&](const Member& m) { return std::find(groups.begin(), groups.end(), m.pgrp) != groups.end(); };
  for (bool grew = true; grew;) {
    grew = false;
    for (const Member& m : all) {
      if (!in_job(m)) continue;
      const auto name = procfs::comm(m.pid);
      if (!name || (*name != "looplock" && *name != "looplock-etcd")) continue;
      for (const Member& c : all) {
        if (c.ppid == m.pid && c.pgrp == c.pid && !in_job(c)) {
          groups.push_back(c.pgrp);
          grew = true;
        }
      }
    }
  }
  std::erase_if(all, [&](const Member& m) { return !in_job(m); });
  return all;
}

}  // namespace

bool GroupWarning::pass() {
  if (!procfs::proc_is_ours()) return false;
  for (const Member& m : job_members(self_, pgid_)) {
    if (std::find(sent_.begin(), sent_.end(), m.pid) != sent_.end()) continue;
    if (std::find(seen_.begin(), seen_.end(), m.pid) == seen_.end()) seen_.push_back(m.pid);
    const auto masks = procfs::signal_masks(m.pid);
    if (!masks || !masks->catches(sig_)) continue;
    if (signal_in_group(m.pid, m.pgrp, sig_)) sent_.push_back(m.pid);
  }
  return true;
}

std::vector<Pid> GroupWarning::skipped() const {
  std::vector<Pid> out;
  for (const Pid p : seen_) {
    if (std::find(sent_.begin(), sent_.end(), p) == sent_.end()) out.push_back(p);
  }
  return out;
}

}  // namespace looplock::sys
