// Running the command as a job: fork/exec with the lock fd passed on purpose
// and the inherited signal state restored; the job leads a process group of
// its own (and gets the terminal, see terminal.hpp); then a loop in ordinary
// code (every signal blocked, taken with sigtimedwait, as tini and dumb-init
// do) forwards each signal to the job's group once, reaps what the job
// leaves behind, renews a lease, and ends the job when --kill-after,
// --max-time or the lease says so.
#pragma once

#include <unistd.h>

#include "base/log.hpp"
#include "job/job.hpp"
#include "job/signals.hpp"
#include "os/ids.hpp"

namespace looplock {

// Starts the command and supervises it until it has ended (and, when
// looplock ended it, until its whole process group has), leaving every signal
// blocked. `self` is looplock's pid. Throws Fatal 71 if it cannot be started
// safely, 126/127 if the command cannot be executed (after reaping the child).
JobEnd run_command(const CommandSpec& spec, const InheritedSignals& inherited, const Logger& log,
                   Pid self = getpid());

// Replaces looplock with the command (-F). Returns only by throwing Fatal.
[[noreturn]] void exec_command(const CommandSpec& spec, const InheritedSignals& inherited);

// Jobs as processes: looplock's signal state taken (take_signal_control)
// and what it inherited given back to each command.
class ProcessJobs final : public JobRunner {
public:
  void take_control(Pid self) override { inherited_ = take_signal_control(self); }
  JobEnd run(const CommandSpec& spec, const Logger& log, Pid self) override {
    return run_command(spec, inherited_, log, self);
  }
  [[noreturn]] void exec(const CommandSpec& spec) override { exec_command(spec, inherited_); }
  [[noreturn]] void exit_like(int status) override { looplock::exit_like(status); }

private:
  InheritedSignals inherited_;
};

// The status and message for an exec(2) errno: 127 when not found, else 126.
int exec_failure_status(int err);

}  // namespace looplock
