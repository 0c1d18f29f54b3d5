// Start a job and supervise it: what the job loop (job/job_loop.hpp) asks of
// the operating system, in its own words. A job is the command and whatever
// it starts, in a group of its own that looplock can signal, end or kill as
// one; looplock takes its own signals for the run and gives the command back
// what it inherited. The loop decides when (deadlines, the lease, the
// warning); this interface does it. POSIX: os/posix/job_control.hpp (vfork,
// a process group, signals taken with sigtimedwait, the terminal).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "os/clock.hpp"
#include "os/failure.hpp"
#include "os/ids.hpp"
#include "os/interrupts.hpp"

namespace looplock::sys {

// What to start: the command (argv[0] looked up in PATH as execvp(3) does),
// its whole environment ("NAME=value"), and a descriptor it inherits on
// purpose (-1: none).
struct JobStart {
  const std::vector<std::string>& argv;
  const std::vector<std::string>& env;
  int pass_fd = -1;
  int also_pass_fd = -1;
  bool shell = false;  // argv is shell_argv()'s (-c): windows/ passes its text to cmd.exe whole
};

// The argv that runs `text` through the system's shell (-c): posix/:
// /bin/sh -c -- TEXT; windows/: %ComSpec% /d /s /c TEXT (cmd.exe without
// its AutoRun commands, TEXT whole: os/windows/command_line.hpp).
std::vector<std::string> shell_argv(const std::string& text);

// Whether an exec failure's errno means that the command was not found (a
// shell's 127) rather than found and not executable (126).
bool exec_not_found(int err);

// A signal for the job that looplock took and passed on to its group.
struct Forwarded {
  int signal = 0;
  bool asks_end = false;  // TERM or INT: --kill-after starts
};

// --warn-before's warning, sent only to the job's processes that handle it.
class JobWarning {
public:
  virtual ~JobWarning() = default;
  // One pass: each process of the job that handles the signal and has not
  // had it yet gets it. False when the system cannot tell who handles it
  // (then nothing is sent).
  virtual bool pass() = 0;
  virtual const std::vector<Pid>& sent() const = 0;
  // The processes seen that never handled it (they were not sent it).
  virtual std::vector<Pid> skipped() const = 0;
};

// A started job. Every call returns at once but pass_signal, which waits.
class RunningJob {
public:
  virtual ~RunningJob() = default;
  // The job's group (POSIX: its process group, led by the command).
  virtual Pid group() const = 0;
  // Whether giving the job the terminal failed (the errno; 0: it did not).
  virtual int terminal_error() const = 0;

  // What reap() found: the command's end (its wait status), once; or that
  // looplock lost track of the job (`lost_err`, an errno: ECHILD when the
  // system says looplock has no child), which kills the whole job first.
  struct Reaped {
    std::optional<int> command_status;
    int lost_err = 0;
  };
  // Collects what of the job has ended, without waiting. A stop of the
  // command is passed upwards as a shell would see it (os/posix/
  // job_control.hpp says how), and the job continued after it.
  virtual Reaped reap() = 0;
  // Whether none of the job's processes is left.
  virtual bool gone() const = 0;
  // Asks the whole job to end (TERM, and CONT for a stopped one).
  virtual void terminate() = 0;
  virtual void kill() = 0;
  // Waits until `until` (none: without limit) for a signal
  // to looplock, and passes it on to the job. What was passed on; nothing
  // when the time came, or what arrived was not for the job (a child's end,
  // looplock's own, a CONT that continues the job, a hangup that reaches the
  // job without looplock).
  virtual std::optional<Forwarded> pass_signal(Deadline until) = 0;
  // What ends a lease's renewal early while the job runs.
  virtual const Interrupts& interrupting() const = 0;
  // --warn-before's warning of signal `sig` to this job.
  virtual std::unique_ptr<JobWarning> warning(int sig) = 0;
};

// looplock's control of its own signals for the run, and the jobs it starts
// under it.
class JobControl {
public:
  virtual ~JobControl() = default;
  // Starts the command as a job (os/posix/job_control.hpp says what it gets
  // back and what it is given).
  virtual std::variant<std::unique_ptr<RunningJob>, Failure> start(const JobStart& spec) = 0;
  // Replaces looplock with the command (-F); returns only what failed.
  virtual Failure exec(const JobStart& spec) = 0;
};

// Takes looplock's own signal state for the run (os/posix/signals.hpp says
// what changes and why) for `self`, looplock's pid.
std::variant<std::unique_ptr<JobControl>, Failure> take_job_control(Pid self);

// Leaves looplock the way the command left: dying of the signal that killed
// it (wait status `wait_status`; never with a core file of looplock's own),
// else exiting `exit_status`. As PID 1 of a pid namespace, which cannot die
// of its own signal, it exits `exit_status` then too.
[[noreturn]] void exit_like(int wait_status, int exit_status);

}  // namespace looplock::sys
