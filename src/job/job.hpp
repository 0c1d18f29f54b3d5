// The job as the layers above see it: what to run with which limits, how it
// ended, and what runs it (JobRunner: the operating system's jobs under
// job_loop.hpp's loop, or a fake in Run's unit tests).
#pragma once

#include <functional>

#include <string>
#include <vector>

#include "base/log.hpp"
#include "job/job_limits.hpp"
#include "job/lease.hpp"
#include "os/clock.hpp"
#include "os/ids.hpp"

namespace looplock {

struct CommandSpec {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // the whole environment, "NAME=value"
  int pass_fd = -1;              // an fd to leave open in the command, or -1
  int also_pass_fd = -1;         // a second one (--holders' index file, beside the lock file), or -1
  bool shell = false;            // argv is sys::shell_argv()'s (-c)
  JobLimits limits;              // --kill-after, --max-time, --warn-before
  Lease* lease = nullptr;
  // Looked at every kOuterPoll while the job runs: true once what the run
  // runs inside has ended (a hold's tie), which ends the job as --max-time
  // does. Unset: nothing to look at.
  std::function<bool()> outer_ended;
};

// How the job ended.
struct JobEnd {
  enum class EndedBy {
    Command,  // by itself, or by a signal someone sent it
    MaxTime,  // looplock ended it: --max-time
    Lease,    // looplock ended it: the lease was lost or about to expire
  };
  int status = 0;  // the wait status of the command (the job's first process)
  EndedBy ended_by = EndedBy::Command;
  bool killed = false;         // looplock had to send KILL
  bool lease_lost = false;     // the lease was lost, or about to expire, while the job ran
  bool outer_ended = false;    // MaxTime because what the run ran inside ended (CommandSpec::outer_ended)
  Instant started;             // when the command was started
  Deadline term_sent;          // when looplock sent TERM (MaxTime, Lease)
  Instant ended;               // when the whole job had ended
  Pid pgid = 0;              // the job's process group
  bool signalled = false;      // looplock sent the job's group a signal (forwarded, TERM or KILL of its own)
  Deadline warned;             // when the --warn-before warning was due and given (none: it was not)
  int warn_signal = 0;         // which signal
  std::vector<Pid> warned_pids;  // the job's processes it was sent to (those that catch it)
  std::vector<Pid> warn_skipped;  // those seen that do not catch it, and were not sent it
};

// What runs a run's command: the system's jobs (process_jobs.hpp), or, in Run's unit
// tests, a fake that says how the job ended.
class JobRunner {
public:
  virtual ~JobRunner() = default;
  // Takes looplock's own signal state for the run, before it waits for
  // anything; what looplock inherited is what each command gets back.
  // `self` is looplock's pid. Throws Fatal 71 when it cannot.
  virtual void take_control(Pid self) = 0;
  // Starts the command and supervises it until it has ended (and, when
  // looplock ended it, until its whole process group has). Throws Fatal 71
  // if it cannot be started safely, 126/127 if the command cannot be
  // executed.
  virtual JobEnd run(const CommandSpec& spec, const Logger& log) = 0;
  // Replaces looplock with the command (-F). Returns only by throwing Fatal.
  [[noreturn]] virtual void exec(const CommandSpec& spec) = 0;
  // Leaves looplock the way the command left (JobEnd::status): with its
  // exit status, or dying of the signal that killed it.
  [[noreturn]] virtual void exit_like(int status) = 0;
};

// The exit status looplock reports for the command's status (JobEnd::status),
// when it does not die of the signal itself: N, or 128+S.
int shell_status(int status);

}  // namespace looplock
