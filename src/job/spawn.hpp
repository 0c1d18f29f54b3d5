// Running the command as a job: fork/exec with the lock fd passed on purpose
// and the inherited signal state restored; the job leads a process group of
// its own (and gets the terminal, see terminal.hpp); then a loop in ordinary
// code (every signal blocked, taken with sigtimedwait, as tini and dumb-init
// do) forwards each signal to the job's group once, reaps what the job
// leaves behind, renews a lease, and ends the job when --kill-after,
// --max-time or the lease says so.
#pragma once

#include <unistd.h>

#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "base/log.hpp"
#include "job/lease.hpp"
#include "job/signals.hpp"
#include "os/ids.hpp"
#include "settings/job_limits.hpp"

namespace looplock {

struct CommandSpec {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // the whole environment, "NAME=value"
  int pass_fd = -1;              // an fd to leave open in the command, or -1
  JobLimits limits;              // --kill-after, --max-time, --warn-before
  Lease* lease = nullptr;
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
  long long started_ns = 0;    // when the command was started
  long long term_sent_ns = 0;  // when looplock sent TERM (MaxTime, Lease)
  long long ended_ns = 0;      // when the whole job had ended
  Pid pgid = 0;              // the job's process group
  bool signalled = false;      // looplock sent the job's group a signal (forwarded, TERM or KILL of its own)
  long long warned_ns = 0;     // when the --warn-before warning was due and given (0: it was not)
  int warn_signal = 0;         // which signal
  std::vector<Pid> warned_pids;  // the job's processes it was sent to (those that catch it)
  std::vector<Pid> warn_skipped;  // those seen that do not catch it, and were not sent it
};

// Starts the command and supervises it until it has ended (and, when
// looplock ended it, until its whole process group has), leaving every signal
// blocked. `self` is looplock's pid. Throws Fatal 71 if it cannot be started
// safely, 126/127 if the command cannot be executed (after reaping the child).
JobEnd run_command(const CommandSpec& spec, const InheritedSignals& inherited, const Logger& log,
                   Pid self = getpid());

// Replaces looplock with the command (-F). Returns only by throwing Fatal.
[[noreturn]] void exec_command(const CommandSpec& spec, const InheritedSignals& inherited);

// What runs a run's command: processes (ProcessJobs), or, in Run's unit
// tests, a fake that says how the job ended.
class JobRunner {
public:
  virtual ~JobRunner() = default;
  // As run_command().
  virtual JobEnd run(const CommandSpec& spec, const InheritedSignals& inherited, const Logger& log, Pid self) = 0;
  // As exec_command(): returns only by throwing.
  [[noreturn]] virtual void exec(const CommandSpec& spec, const InheritedSignals& inherited) = 0;
};

class ProcessJobs final : public JobRunner {
public:
  JobEnd run(const CommandSpec& spec, const InheritedSignals& inherited, const Logger& log, Pid self) override {
    return run_command(spec, inherited, log, self);
  }
  [[noreturn]] void exec(const CommandSpec& spec, const InheritedSignals& inherited) override {
    exec_command(spec, inherited);
  }
};

// The status and message for an exec(2) errno: 127 when not found, else 126.
int exec_failure_status(int err);

}  // namespace looplock
