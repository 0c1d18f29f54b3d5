#include "job/spawn.hpp"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "job/next_step.hpp"
#include "job/terminal.hpp"
#include "job/warning.hpp"
#include "os/ids.hpp"
#include "os/posix/interrupts.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {

// While looplock waits for the rest of a job it ended (members that are not
// its children send it no SIGCHLD), how often it looks.
constexpr long long kGroupPollNs = 20'000'000LL;
// Once warned, until the TERM: how often looplock looks for processes of the
// job that catch the warning signal by now.
constexpr long long kWarnPassNs = 100'000'000LL;

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

std::string exec_hint(int err, const std::string& name) {
  if (err == ENOENT) {
    return name.find('/') == std::string::npos ? "Check the name and PATH, or give the command's full path."
                                               : "Check the path.";
  }
  if (err == EACCES) return "Check that it is a file with execute permission (chmod +x).";
  return {};
}

[[noreturn]] void exec_failed(const std::string& name, int err) {
  throw Fatal(exec_failure_status(err), errno_message("cannot run " + quote(name), err), exec_hint(err, name));
}

// What the child reports back through the memory it shares with looplock
// until it has exec'd (vfork): the step that failed and its errno.
enum class ChildStep { None, DeathSignal, Group, PassFd, SignalMask, Exec };
struct ChildReport {
  ChildStep failed = ChildStep::None;
  int err = 0;
  int terminal_err = 0;  // giving it the terminal failed (not fatal)
};

[[noreturn]] void child_failed(const ChildStep step, const std::string& name, int err) {
  switch (step) {
    case ChildStep::DeathSignal:
      fail_errno(exit_code::kOsError, "cannot start the command: cannot tie it to looplock's life (prctl)", err);
    case ChildStep::Group:
      fail_errno(exit_code::kOsError, "cannot start the command in a process group of its own (setpgid)", err);
    case ChildStep::PassFd:
      fail_errno(exit_code::kOsError, "cannot pass the lock descriptor to the command (fcntl)", err,
                 "The command was not run: without the descriptor it would run without the lock.");
    case ChildStep::SignalMask:
      fail_errno(exit_code::kOsError, "cannot give the command its inherited signal mask (sigprocmask)", err);
    case ChildStep::Exec:
    case ChildStep::None: break;
  }
  exec_failed(name, err);
}

// The job: its process group, and what looplock does to it.
class Job {
public:
  // `has_terminal`: the job was made the terminal's foreground group.
  Job(Pid leader, const Terminal& tty, bool has_terminal) : pgid_(leader), tty_(tty), has_terminal_(has_terminal) {}
  Pid pgid() const { return pgid_; }

  void signal(int sig) const { (void)kill(-pgid_, sig); }
  // Whether no process of the group is left (zombies still count).
  bool gone() const { return kill(-pgid_, 0) != 0 && errno == ESRCH; }

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

  void ended() { take_back(); }

  // Whether the terminal's hangup reaches the job from the kernel itself:
  // the job was the terminal's foreground group when it hung up, and the
  // session leader is another process (a shell), whose exit sends that group
  // HUP. The shell's own HUP to looplock's group then must not be forwarded
  // as a second one. (When looplock leads the session, the kernel sends the
  // hangup to looplock alone, and looplock forwards it.)
  bool hangup_reaches_it_directly() const { return has_terminal_ && tty_.hung_up() && getsid(0) != getpid(); }

private:
  void take_back() {
    tty_.take_back_from(pgid_);
    has_terminal_ = false;
  }

  Pid pgid_;
  const Terminal& tty_;
  bool has_terminal_;
};

// The signal state of a job's run: every signal looplock supervises is
// blocked from the start and taken in the loop; they stay blocked after the
// command has ended, until looplock exits (there is nobody to pass them to
// any more).
struct SignalSets {
  sigset_t supervised;
  // A lease renewal that etcd does not answer gives way to any of these
  // (CHLD aside: a job's orphans may send it often, and the command's end
  // can wait for the renewal).
  sys::Interrupts interrupting;
};

SignalSets block_signals() {
  SignalSets s{supervised_signals(), {supervised_signals()}};
  sigdelset(&s.interrupting.signals, SIGCHLD);
  if (sigprocmask(SIG_BLOCK, &s.supervised, nullptr) != 0) {
    fail_errno(exit_code::kOsError, "cannot block signals to run the command", errno);
  }
  return s;
}

// Starts the command: a process group of its own, the terminal's foreground
// group when looplock is in the foreground, the lock descriptor passed on
// purpose and the inherited signal state restored. Returns its pid, and in
// `has_terminal` whether it got the terminal.
Pid start_job(const CommandSpec& spec, const InheritedSignals& inherited, const Terminal& tty, const Logger& log,
                Pid parent, bool& has_terminal) {
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  const bool give_terminal = tty.looplock_in_foreground();

  // vfork: the child borrows looplock's memory until it has exec'd (or
  // failed to), which is cheaper than copying it, and reports a failure
  // through `report`. Between vfork and exec the child only makes system
  // calls (no allocation, no locks), and looplock is suspended meanwhile.
  volatile ChildReport report;
  const Pid child = vfork();
  if (child < 0) fail_errno(exit_code::kOsError, "cannot start the command (vfork)", errno);
  if (child == 0) {
    auto fail = [&](ChildStep step) {
      report.err = errno;
      report.failed = step;
      _exit(exit_code::kOsError);
    };
    // The command must not outlive looplock: it would run on unprotected.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(ChildStep::DeathSignal);
    if (getppid() != parent) _exit(exit_code::kOsError);
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
    if (!restore_in_child(inherited)) fail(ChildStep::SignalMask);
    execvpe(argv[0], argv.data(), envp.data());
    report.err = errno;
    report.failed = ChildStep::Exec;
    _exit(exec_failure_status(errno));
  }
  if (report.failed != ChildStep::None) {
    int st = 0;
    (void)sys::retry_eintr([&] { return waitpid(child, &st, 0); });
    tty.take_back_from(child);
    child_failed(report.failed, spec.argv[0], report.err);
  }
  if (report.terminal_err != 0) {
    log.warn("terminal", errno_message("cannot give the terminal to the command", report.terminal_err));
  }
  has_terminal = give_terminal && report.terminal_err == 0;
  return child;
}

// The loop that runs until the job has ended (tini's, dumb-init's): reap
// what ended, carry out what next_step() says is due, else wait for a signal
// and pass it on to the job.
class JobLoop {
public:
  JobLoop(const CommandSpec& spec, const Logger& log, const SignalSets& signals, Job& job, JobEnd& end, bool has_tty,
             Pid parent)
      : spec_(spec),
        log_(log),
        signals_(signals),
        job_(job),
        end_(end),
        parent_(parent),
        wait_flags_(WNOHANG | (has_tty ? WUNTRACED : 0)),
        lease_live_(spec.lease != nullptr) {
    if (spec.limits.max_time_ns && *spec.limits.max_time_ns > 0) max_time_at_ = later(end.started_ns, *spec.limits.max_time_ns);
  }

  void run() {
    for (;;) {
      reap();
      const long long now = sys::monotonic_ns();
      if (leader_done_ && (!whole_group_ || job_.gone())) break;
      const NextStep next = next_step(deadlines(now), now);
      if (next.action != JobAction::None) {
        act(next, now);
        continue;
      }
      take_signal(next.until, now);
    }
    end_.killed = killed_;
    end_.ended_ns = sys::monotonic_ns();
  }

private:
  JobDeadlines deadlines(long long now) const {
    JobDeadlines d;
    d.kill_at = kill_at_;
    d.max_time_at = max_time_at_;
    if (lease_live_) {
      d.lease_term_at = spec_.lease->term_by_ns();
      d.renew_at = spec_.lease->next_renewal_ns();
    }
    // The warning, once: before --max-time's TERM, and before the lease's
    // when its renewals are failing (a short etcd outage may warn without a
    // TERM following); a renewal returns by the time it would be due.
    if (spec_.limits.warn_before_ns && end_.warned_ns == 0) {
      const long long w = *spec_.limits.warn_before_ns;
      if (max_time_at_ != 0) d.warn_at = std::max(max_time_at_ - w, 1LL);
      if (lease_live_) {
        const long long lease_warn = std::max(d.lease_term_at - w, 1LL);
        if (spec_.lease->renewal_failing()) {
          d.warn_at = earliest(d.warn_at, lease_warn);
        } else {
          d.lease_warn_at = lease_warn;
          d.renew_least_ns = spec_.lease->least_renewal_ns();
        }
      }
    }
    if (leader_done_) d.group_poll_at = now + kGroupPollNs;
    if (warning_ && !term_sent_ && !leader_done_ && now < warn_until_) d.warn_pass_at = next_warn_pass_;
    return d;
  }

  // Reaps the command and any orphan of the job handed to looplock.
  void reap() {
    for (;;) {
      int st = 0;
      const Pid r = waitpid(-1, &st, wait_flags_);
      if (r == 0) return;
      if (r < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        if (err == ECHILD && leader_done_) return;
        // looplock cannot follow the job any more: it must not run on while
        // the lock is released.
        job_.signal(SIGKILL);
        job_.ended();
        fail_errno(exit_code::kOsError,
                   err == ECHILD ? "lost track of the command: wait(2) says looplock has no child"
                                 : "cannot wait for the command",
                   err, "The command's process group was sent KILL.");
      }
      if (r != job_.pgid()) continue;  // an orphan, reaped
      if (WIFSTOPPED(st)) {
        job_.stopped(WSTOPSIG(st));
        continue;
      }
      end_.status = st;
      leader_done_ = true;
      job_.ended();
    }
  }

  void act(const NextStep& next, long long now) {
    switch (next.action) {
      case JobAction::Kill:
        log_.warn("kill_after",
                  end_.ended_by == JobEnd::EndedBy::Command
                      ? "the command did not end within --kill-after of the TERM/INT it was sent; sending KILL"
                  : end_.ended_by == JobEnd::EndedBy::MaxTime
                      ? "the command did not end within --kill-after of the TERM sent at --max-time; sending KILL"
                      : "the command did not end before the lease could expire; sending KILL");
        job_.signal(SIGKILL);
        end_.signalled = true;
        kill_at_ = 0;
        killed_ = true;
        return;
      case JobAction::MaxTimeTerm: {
        max_time_at_ = 0;
        const auto& k = spec_.limits.max_time_kill_after_ns;
        terminate(JobEnd::EndedBy::MaxTime, k && *k > 0 ? later(now, *k) : 0);
        return;
      }
      case JobAction::LeaseTerm:
        lease_live_ = false;
        end_.lease_lost = true;
        terminate(JobEnd::EndedBy::Lease, spec_.lease->kill_by_ns());
        return;
      case JobAction::Renew:
        if (!spec_.lease->renew(next.until, signals_.interrupting)) {
          // Gone for good: another host may hold the lock already, so KILL
          // comes no later than the lease's kill-after from now.
          lease_live_ = false;
          end_.lease_lost = true;
          const long long kill_after = std::max(spec_.lease->kill_by_ns() - spec_.lease->term_by_ns(), 0LL);
          terminate(JobEnd::EndedBy::Lease, std::min(spec_.lease->kill_by_ns(), sys::monotonic_ns() + kill_after));
        }
        return;
      case JobAction::Warn: warn(now); return;
      case JobAction::WarnPass:
        next_warn_pass_ = later(now, kWarnPassNs);
        (void)warning_->pass();
        note_warned();
        return;
      case JobAction::None: return;
    }
  }

  // --warn-before's signal: once due, to each process of the job that
  // catches it (warning.hpp), with one line (-q hides it); then, until the
  // TERM it warns of, every 100 ms to any that catches it by then.
  void warn(long long now) {
    const bool by_lease = max_time_at_ == 0 || (lease_live_ && spec_.lease->term_by_ns() < max_time_at_);
    const long long term_at = by_lease ? spec_.lease->term_by_ns() : max_time_at_;
    const std::string sig = signal_name(spec_.limits.warn_signal);
    const std::string when =
        (by_lease ? "the lease's renewals are failing, and its TERM comes in " : "--max-time's TERM comes in ") +
        format_duration(term_at - now) + " (--warn-before)";
    const Json facts = {{"signal", sig}, {"term_in_ms", (term_at - now) / 1'000'000}};
    end_.warned_ns = now;
    end_.warn_signal = spec_.limits.warn_signal;
    warning_.emplace(parent_, job_.pgid(), spec_.limits.warn_signal);
    if (!warning_->pass()) {
      warning_.reset();
      log_.warn("warning_not_sent",
                "did not send " + sig +
                    ": without /proc of this pid namespace looplock cannot tell which processes of the job catch it, "
                    "and it would end those that do not; " + when,
                facts);
      return;
    }
    warn_until_ = term_at;
    next_warn_pass_ = later(now, kWarnPassNs);
    note_warned();
    const auto& sent = warning_->sent();
    const auto skipped = warning_->skipped();
    std::string to = sent.empty() ? "to no process yet: none catches it"
                                  : "to " + pids_text(sent) + (sent.size() > 1 ? ", which catch it" : ", which catches it");
    if (!skipped.empty()) to += " (skipped " + pids_text(skipped) + (skipped.size() > 1 ? ", which do not)" : ", which does not)");
    if (sent.empty()) to += "; it goes to any that catches it before the TERM";
    Json f = facts;
    f["pids"] = sent;
    f["skipped"] = skipped;
    log_.warn("warned", "sent " + sig + " to the job: " + to + "; " + when, f);
  }

  // What the warning has reached so far, for the job's end.
  void note_warned() {
    end_.warned_pids = warning_->sent();
    end_.warn_skipped = warning_->skipped();
    if (!end_.warned_pids.empty()) end_.signalled = true;
  }

  // looplock ends the job: TERM (and CONT, for a stopped job) to the group,
  // once; KILL by `kill_at` (0: never); and the whole group is waited for.
  void terminate(JobEnd::EndedBy by, long long kill_at) {
    if (!term_sent_) {
      job_.signal(SIGTERM);
      job_.signal(SIGCONT);
      end_.signalled = true;
      term_sent_ = true;
      end_.term_sent_ns = sys::monotonic_ns();
    }
    if (end_.ended_by == JobEnd::EndedBy::Command) end_.ended_by = by;
    whole_group_ = true;
    kill_at_ = earliest(kill_at_, kill_at);
  }

  // Waits for a signal until `until` (0: without limit) and passes it on.
  void take_signal(long long until, long long now) {
    siginfo_t info{};
    int sig;
    if (until != 0) {
      const long long left = std::max(until - now, 1LL);
      const timespec ts{static_cast<time_t>(left / kSec), static_cast<long>(left % kSec)};
      sig = sigtimedwait(&signals_.supervised, &info, &ts);
    } else {
      sig = sigwaitinfo(&signals_.supervised, &info);
    }
    if (sig < 0) return;  // EINTR, or EAGAIN: a deadline came
    const bool sent = info.si_code == SI_USER || info.si_code == SI_QUEUE || info.si_code == SI_TKILL;
    if (sig == SIGCHLD && !sent) return;  // a child changed state: reaped next
    // looplock's own: a write of its own to a closed pipe or past
    // RLIMIT_FSIZE (the kernel sends PIPE or XFSZ as from looplock itself).
    if (sent && info.si_pid == parent_) return;
    if (sig == SIGCONT) {
      job_.resume();
      return;
    }
    if (sig == SIGHUP && job_.hangup_reaches_it_directly()) return;
    job_.signal(sig);
    end_.signalled = true;
    if ((sig == SIGTERM || sig == SIGINT) && spec_.limits.kill_after_ns && !kill_after_armed_) {
      kill_after_armed_ = true;
      whole_group_ = true;
      kill_at_ = earliest(kill_at_, later(sys::monotonic_ns(), *spec_.limits.kill_after_ns));
    }
  }

  const CommandSpec& spec_;
  const Logger& log_;
  const SignalSets& signals_;
  Job& job_;
  JobEnd& end_;
  const Pid parent_;
  const int wait_flags_;
  bool lease_live_;
  long long max_time_at_ = 0;
  long long kill_at_ = 0;          // 0: no KILL planned
  bool kill_after_armed_ = false;  // a forwarded TERM/INT started --kill-after
  bool term_sent_ = false;         // looplock sent its own TERM (--max-time, the lease)
  bool whole_group_ = false;       // wait for the whole group, not only the command's first process
  bool killed_ = false;
  bool leader_done_ = false;
  std::optional<JobWarning> warning_;  // once warned (and /proc tells who catches the signal)
  long long warn_until_ = 0;           // the TERM the warning is about
  long long next_warn_pass_ = 0;
};

}  // namespace

int exec_failure_status(int err) {
  return (err == ENOENT || err == ENOTDIR || err == ENAMETOOLONG) ? exit_code::kNotFound : exit_code::kNotExecutable;
}

JobEnd run_command(const CommandSpec& spec, const InheritedSignals& inherited, const Logger& log, Pid self) {
  const SignalSets signals = block_signals();
  // Orphans of the job are reparented to looplock and reaped here: that
  // keeps the job's processes findable (a lock they keep is reported) and,
  // as PID 1 of a pid namespace, reaps what would otherwise pile up.
  (void)prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Which of stdin, stdout and stderr is looplock's controlling terminal
  // (tcgetpgrp(3) each, until one is): the job gets it and gives it back.
  const Terminal tty = Terminal::find();
  bool has_terminal = false;
  const Pid child = start_job(spec, inherited, tty, log, self, has_terminal);
  JobEnd end;
  end.started_ns = sys::monotonic_ns();
  end.pgid = child;
  Job job(child, tty, has_terminal);
  JobLoop(spec, log, signals, job, end, tty.present(), self).run();
  return end;
}

void exec_command(const CommandSpec& spec, const InheritedSignals& inherited) {
  auto argv = c_strings(spec.argv);
  auto envp = c_strings(spec.env);
  if (spec.pass_fd >= 0 && fcntl(spec.pass_fd, F_SETFD, 0) != 0) child_failed(ChildStep::PassFd, spec.argv[0], errno);
  if (!restore_in_child(inherited)) child_failed(ChildStep::SignalMask, spec.argv[0], errno);
  execvpe(argv[0], argv.data(), envp.data());
  exec_failed(spec.argv[0], errno);
}

std::unique_ptr<JobRunner> process_jobs() { return std::make_unique<ProcessJobs>(); }

}  // namespace looplock
