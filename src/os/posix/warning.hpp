// --warn-before's warning on POSIX (os/job_control.hpp's JobWarning), sent
// only to what handles it: each process of the
// job's process group (and of the job of a looplock nested in it) that
// catches the signal (SigCgt in /proc/PID/status)
// gets it once, through a pidfd (pidfd_open(2), pidfd_send_signal(2)) after
// its process group is checked again, so that a reused pid is never
// signalled. A process that blocks the signal without a handler, or ignores
// it, is skipped (its default action, for USR1 the end of a shell running
// the real work, is what the warning must not cause). Passes are repeated
// until the TERM it warns of, so that a process that installs its handler
// late still gets it once.
#pragma once

#include <vector>

#include "os/ids.hpp"
#include "os/job_control.hpp"

namespace looplock::sys {

class GroupWarning final : public JobWarning {
public:
  // The job: process group `pgid`, whose processes are descendants of
  // looplock (`self`: it is their subreaper).
  GroupWarning(Pid self, Pid pgid, int sig) : self_(self), pgid_(pgid), sig_(sig) {}

  // One pass: each process of the group that catches the signal and has not
  // had it yet gets it. False when /proc cannot tell who catches it (then
  // nothing is sent).
  bool pass() override;

  const std::vector<Pid>& sent() const override { return sent_; }
  // The processes seen in the group that never caught it (they were not sent it).
  std::vector<Pid> skipped() const override;

private:
  Pid self_;
  Pid pgid_;
  int sig_;
  std::vector<Pid> sent_;
  std::vector<Pid> seen_;
};

// Sends `sig` to `pid` only while it is in process group `pgid`: through a
// pidfd that pins the process before the group is checked again (without
// pidfds, Linux before 5.3, the check and kill(2) follow each other). False
// when it was not sent.
bool signal_in_group(Pid pid, Pid pgid, int sig);

}  // namespace looplock::sys
