#include "os/posix/job_control.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "os/ids.hpp"
#include "os/posix/interrupts.hpp"
#include "os/posix/signals.hpp"
#include "os/posix/terminal.hpp"
#include "os/posix/warning.hpp"
#include "os/sys.hpp"

namespace looplock::sys {

std::vector<std::string> shell_argv(const std::string& text) {
  return {"/bin/sh", "-c", "--", text};  // "--": a string may start with "-"
}

std::variant<std::unique_ptr<JobControl>, Failure> take_job_control(Pid self) {
  auto taken = take_signal_control(self);
  if (auto* f = std::get_if<Failure>(&taken)) return std::move(*f);
  return std::make_unique<ProcessControl>(std::get<InheritedSignals>(std::move(taken)), self);
}

namespace {

constexpr long long kSecNs = 1'000'000'000LL;
// The exit status of a child that failed before exec: never looked at
// (ChildReport says what failed).
constexpr int kChildFailed = 71;

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// What the child reports back through the memory it shares with looplock
// until it has exec'd (vfork): the step that failed and its errno.
enum class ChildStep { None, DeathSignal, Group, PassFd, SignalMask, Exec };
struct ChildReport {
  ChildStep failed = ChildStep::None;
  int err = 0;
  int terminal_err = 0;  // giving it the terminal failed (not fatal)
};

Failure child_failure(ChildStep step, int err) {
  switch (step) {
    case ChildStep::DeathSignal:
      return {.what = "cannot start the command: cannot tie it to looplock's life (prctl)", .err = err};
    case ChildStep::Group:
      return {.what = "cannot start the command in a process group of its own (setpgid)", .err = err};
    case ChildStep::PassFd:
      return {.what = "cannot pass the lock descriptor to the command (fcntl)",
              .err = err,
              .hint = "The command was not run: without the descriptor it would run without the lock."};
    case ChildStep::SignalMask:
      return {.what = "cannot give the command its inherited signal mask (sigprocmask)", .err = err};
    case ChildStep::Exec:
    case ChildStep::None: break;
  }
  return {.err = err, .of = Failure::Of::Command};
}

// The signal state of a job's run: every signal looplock supervises is
// blocked from the start and taken in the loop; they stay blocked after the
// command has ended, until looplock exits (there is nobody to pass them to
// any more).
struct SignalSets {
  sigset_t supervised;
  // A lease renewal that etcd does not answer gives way to any of these
  // (CHLD aside: a job's orphans may send it often, and the command's end
  // can wait for the renewal).
  Interrupts interrupting;
};

// The job: its process group, led by the command, and what looplock does to it.
class ProcessGroupJob final : public RunningJob {
public:
  // `has_terminal`: the job was made the terminal's foreground group.
  ProcessGroupJob(Pid leader, const SignalSets& signals, const Terminal& tty, bool has_terminal, int terminal_err,
                  Pid self)
      : pgid_(leader),
        signals_(signals),
        tty_(tty),
        has_terminal_(has_terminal),
        terminal_err_(terminal_err),
        self_(self),
        wait_flags_(WNOHANG | (tty.present() ? WUNTRACED : 0)) {}

  Pid group() const override { return pgid_; }
  int terminal_error() const override { return terminal_err_; }

  // Reaps the command and any orphan of the job handed to looplock.
  Reaped reap() override {
    Reaped out;
    for (;;) {
      int st = 0;
      const Pid r = waitpid(-1, &st, wait_flags_);
      if (r == 0) return out;
      if (r < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        if (err == ECHILD && command_done_) return out;
        // looplock cannot follow the job any more: it must not run on while
        // the lock is released.
        kill();
        take_back();
        out.lost_err = err;
        return out;
      }
      if (r != pgid_) continue;  // an orphan, reaped
      if (WIFSTOPPED(st)) {
        stopped(WSTOPSIG(st));
        continue;
      }
      out.command_status = st;
      command_done_ = true;
      take_back();
    }
  }

  // Whether no process of the group is left (zombies still count).
  bool gone() const override { return ::kill(-pgid_, 0) != 0 && errno == ESRCH; }
  void terminate() override {
    signal(SIGTERM);
    signal(SIGCONT);
  }
  void kill() override { signal(SIGKILL); }

  std::optional<Forwarded> pass_signal(Deadline until) override {
    siginfo_t info{};
    int sig;
    if (until) {
      const long long left = std::max<long long>((*until - MonotonicClock::now()).count(), 1);
      const timespec ts{static_cast<time_t>(left / kSecNs), static_cast<long>(left % kSecNs)};
      sig = sigtimedwait(&signals_.supervised, &info, &ts);
    } else {
      sig = sigwaitinfo(&signals_.supervised, &info);
    }
    if (sig < 0) return std::nullopt;  // EINTR, or EAGAIN: a deadline came
    const bool sent = info.si_code == SI_USER || info.si_code == SI_QUEUE || info.si_code == SI_TKILL;
    if (sig == SIGCHLD && !sent) return std::nullopt;  // a child changed state: reaped next
    // looplock's own: a write of its own to a closed pipe or past
    // RLIMIT_FSIZE (the kernel sends PIPE or XFSZ as from looplock itself).
    if (sent && info.si_pid == self_) return std::nullopt;
    if (sig == SIGCONT) {
      resume();
      return std::nullopt;
    }
    if (sig == SIGHUP && hangup_reaches_it_directly()) return std::nullopt;
    signal(sig);
    return Forwarded{sig, sig == SIGTERM || sig == SIGINT};
  }

  const Interrupts& interrupting() const override { return signals_.interrupting; }
  std::unique_ptr<JobWarning> warning(int sig) override { return std::make_unique<GroupWarning>(self_, pgid_, sig); }

private:
  void signal(int sig) const { (void)::kill(-pgid_, sig); }

  // The job's first process was stopped (^Z, a read from the terminal in the
  // background, a STOP): do what a shell would see, stop looplock the same
  // way; once looplock is continued, continue the job. A STOP that looplock
  // cannot pass upwards (no job control above it) leaves the job stopped, as
  // whoever sent it meant; a terminal stop is then undone, as the kernel
  // discards it for a process group without job control.
  void stopped(int sig) {
    take_back();
    const bool explicit_stop = sig == SIGSTOP;
    const bool continued = stop_self(explicit_stop ? SIGTSTP : sig);
    if (continued || !explicit_stop) resume();
  }

  // SIGCONT for the job (looplock was continued, or a CONT was sent to it):
  // the terminal goes with it while looplock is in the foreground.
  void resume() {
    has_terminal_ = tty_.looplock_in_foreground() && tty_.give_to(pgid_);
    signal(SIGCONT);
  }

  void take_back() {
    tty_.take_back_from(pgid_);
    has_terminal_ = false;
  }

  // Whether the terminal's hangup reaches the job from the kernel itself:
  // the job was the terminal's foreground group when it hung up, and the
  // session leader is another process (a shell), whose exit sends that group
  // HUP. The shell's own HUP to looplock's group then must not be forwarded
  // as a second one. (When looplock leads the session, the kernel sends the
  // hangup to looplock alone, and looplock forwards it.)
  bool hangup_reaches_it_directly() const { return has_terminal_ && tty_.hung_up() && getsid(0) != getpid(); }

  Pid pgid_;
  SignalSets signals_;
  Terminal tty_;
  bool has_terminal_;
  int terminal_err_;
  Pid self_;
  int wait_flags_;
  bool command_done_ = false;
};

}  // namespace

// Blocks every supervised signal, becomes the job's subreaper (orphans of
// the job are reparented to looplock and reaped in reap(): that keeps the
// job's processes findable, so a lock they keep is reported, and, as PID 1
// of a pid namespace, reaps what would otherwise pile up), finds the
// terminal, then starts the command: a process group of its own, the
// terminal's foreground group when looplock is in the foreground, the lock
// descriptor passed on purpose and the inherited signal state restored.
std::variant<std::unique_ptr<RunningJob>, Failure> ProcessControl::start(const JobStart& spec) {
  SignalSets signals{supervised_signals(), {supervised_signals()}};
  sigdelset(&signals.interrupting.signals, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &signals.supervised, nullptr) != 0) {
    return Failure{.what = "cannot block signals to run the command", .err = errno};
  }
  (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Which of stdin, stdout and stderr is looplock's controlling terminal
  // (tcgetpgrp(3) each, until one is): the job gets it and gives it back.
  const Terminal tty = Terminal::find();
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  const bool give_terminal = tty.looplock_in_foreground();
  const Pid parent = self_;

  // vfork: the child borrows looplock's memory until it has exec'd (or
  // failed to), which is cheaper than copying it, and reports a failure
  // through `report`. Between vfork and exec the child only makes system
  // calls (no allocation, no locks), and looplock is suspended meanwhile.
  volatile ChildReport report;
  const Pid child = vfork();
  if (child < 0) return Failure{.what = "cannot start the command (vfork)", .err = errno};
  if (child == 0) {
    auto fail = [&](ChildStep step) {
      report.err = errno;
      report.failed = step;
      _exit(kChildFailed);
    };
    // The command must not outlive looplock: it would run on unprotected.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(ChildStep::DeathSignal);
    if (getppid() != parent) _exit(kChildFailed);
    if (setpgid(0, 0) != 0) fail(ChildStep::Group);
    // A signal sent to looplock's process group since vfork reached this
    // child too (still in that group, the signal blocked): looplock forwards
    // it once the command runs, so it must not also be left pending here.
    {
      sigset_t all;
      sigfillset(&all);
      const timespec now{0, 0};
      while (sigtimedwait(&all, nullptr, &now) > 0) {
      }
    }
    // Before exec, so that the command never finds itself in the background
    // of its own terminal. SIGTTOU is blocked here, as tcsetpgrp needs.
    if (give_terminal && !tty.give_to(getpid())) report.terminal_err = errno;
    if (spec.pass_fd >= 0 && fcntl(spec.pass_fd, F_SETFD, 0) != 0) fail(ChildStep::PassFd);
    if (spec.also_pass_fd >= 0 && fcntl(spec.also_pass_fd, F_SETFD, 0) != 0) fail(ChildStep::PassFd);
    if (!restore_in_child(inherited_)) fail(ChildStep::SignalMask);
    execvpe(argv[0], argv.data(), envp.data());
    fail(ChildStep::Exec);
  }
  if (report.failed != ChildStep::None) {
    int st = 0;
    (void)retry_eintr([&] { return waitpid(child, &st, 0); });
    tty.take_back_from(child);
    return child_failure(report.failed, report.err);
  }
  const bool has_terminal = give_terminal && report.terminal_err == 0;
  return std::make_unique<ProcessGroupJob>(child, signals, tty, has_terminal, report.terminal_err, self_);
}

Failure ProcessControl::exec(const JobStart& spec) {
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  if (spec.pass_fd >= 0 && fcntl(spec.pass_fd, F_SETFD, 0) != 0) return child_failure(ChildStep::PassFd, errno);
  if (spec.also_pass_fd >= 0 && fcntl(spec.also_pass_fd, F_SETFD, 0) != 0) {
    return child_failure(ChildStep::PassFd, errno);
  }
  if (!restore_in_child(inherited_)) return child_failure(ChildStep::SignalMask, errno);
  execvpe(argv[0], argv.data(), envp.data());
  return child_failure(ChildStep::Exec, errno);
}

}  // namespace looplock::sys
