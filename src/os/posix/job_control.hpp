// os/job_control.hpp on POSIX: the command runs as a job of processes. It
// is started with vfork and exec, with the lock descriptor passed on purpose
// and the inherited signal state restored (signals.hpp); it leads a process
// group of its own, and gets the terminal (terminal.hpp). While it runs,
// every signal looplock can catch is blocked and taken with sigtimedwait in
// ordinary code, as tini and dumb-init do, and passed to the job's group
// once; looplock is the job's subreaper, so it reaps what the job leaves
// behind. A stop of the command stops looplock the same way, so that the
// shell above sees the job stopped; when looplock is continued, so is the
// job. The job never outlives looplock (PR_SET_PDEATHSIG: KILL).
#pragma once

#include <memory>
#include <variant>

#include "os/ids.hpp"
#include "os/job_control.hpp"
#include "os/posix/signals.hpp"

namespace looplock::sys {

class ProcessControl final : public JobControl {
public:
  // `inherited`: what the command gets back (take_signal_control); `self`:
  // looplock's pid.
  ProcessControl(InheritedSignals inherited, Pid self) : inherited_(std::move(inherited)), self_(self) {}

  // Leaves every signal blocked once the job has started.
  std::variant<std::unique_ptr<RunningJob>, Failure> start(const JobStart& spec) override;
  Failure exec(const JobStart& spec) override;

private:
  InheritedSignals inherited_;
  Pid self_;
};

}  // namespace looplock::sys
