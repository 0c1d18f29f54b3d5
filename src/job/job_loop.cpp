#include "job/job_loop.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "job/next_step.hpp"
#include "os/clock.hpp"
#include "os/ids.hpp"
#include "os/signal_names.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {

// While looplock waits for the rest of a job it ended (members that are not
// its children send it no SIGCHLD), how often it looks.
constexpr Duration kGroupPoll = std::chrono::milliseconds(20);
// Once warned, until the TERM: how often looplock looks for processes of the
// job that catch the warning signal by now.
constexpr Duration kWarnPass = std::chrono::milliseconds(100);
// How often looplock looks at what the run runs inside (a hold's end).
constexpr Duration kOuterPoll = std::chrono::milliseconds(200);

std::string exec_hint(int err, const std::string& name) {
  if (err == ENOENT) {
    return std::none_of(name.begin(), name.end(), sys::is_path_separator)
               ? "Check the name and PATH, or give the command's full path."
               : "Check the path.";
  }
  if (err == EACCES) {
    return sys::abilities().exec ? "Check that it is a file with execute permission (chmod +x)."
                                 : "Check that it is a program Windows runs (.exe, .com); run a script through its "
                                   "interpreter, or a batch file with -c.";
  }
  return {};
}

[[noreturn]] void exec_failed(const std::string& name, int err) {
  throw Fatal(exec_failure_status(err), errno_message("cannot run " + quote(name), err), exec_hint(err, name));
}

// Throws what the system could not do for the command's start.
[[noreturn]] void start_failed(const sys::Failure& f, const std::string& name) {
  if (f.of == sys::Failure::Of::Command) exec_failed(name, f.err);
  looplock::fail(exit_code::kOsError, f);
}

// The loop that runs until the job has ended (tini's, dumb-init's): reap
// what ended, carry out what next_step() says is due, else wait for a signal
// and pass it on to the job.
class JobLoop {
public:
  JobLoop(const CommandSpec& spec, const Logger& log, sys::RunningJob& job, JobEnd& end)
      : spec_(spec), log_(log), job_(job), end_(end), lease_live_(spec.lease != nullptr) {
    if (spec.limits.max_time && *spec.limits.max_time > Duration::zero()) {
      max_time_at_ = later(end.started, *spec.limits.max_time);
    }
    if (spec.outer_ended) next_outer_poll_ = end.started;  // at once: it may have ended as the job started
  }

  void run() {
    for (;;) {
      reap();
      const Instant now = MonotonicClock::now();
      if (leader_done_ && (!whole_group_ || job_.gone())) break;
      const NextStep next = next_step(deadlines(now), now);
      if (next.action != JobAction::None) {
        act(next, now);
        continue;
      }
      pass_signal(next.until);
    }
    end_.killed = killed_;
    end_.ended = MonotonicClock::now();
  }

private:
  JobDeadlines deadlines(Instant now) const {
    JobDeadlines d;
    d.kill_at = kill_at_;
    d.max_time_at = max_time_at_;
    if (lease_live_) {
      d.lease_term_at = spec_.lease->term_by();
      d.renew_at = spec_.lease->next_renewal();
    }
    // The warning, once: before --max-time's TERM, and before the lease's
    // when its renewals are failing (a short etcd outage may warn without a
    // TERM following); a renewal returns by the time it would be due.
    if (spec_.limits.warn_before && !end_.warned) {
      const Duration w = *spec_.limits.warn_before;
      if (max_time_at_) d.warn_at = *max_time_at_ - w;
      if (lease_live_) {
        const Instant lease_warn = *d.lease_term_at - w;
        if (spec_.lease->renewal_failing()) {
          d.warn_at = earliest(d.warn_at, lease_warn);
        } else {
          d.lease_warn_at = lease_warn;
          d.renew_least = spec_.lease->least_renewal();
        }
      }
    }
    if (leader_done_) d.group_poll_at = now + kGroupPoll;
    if (warning_ && !term_sent_ && !leader_done_ && now < warn_until_) d.warn_pass_at = next_warn_pass_;
    if (!term_sent_ && !leader_done_) d.outer_poll_at = next_outer_poll_;
    return d;
  }

  // Collects what of the job ended; looplock must not run on when it lost
  // track of the job (the job was killed: the lock is released next).
  void reap() {
    const auto reaped = job_.reap();
    if (reaped.lost_err != 0) {
      fail_errno(exit_code::kOsError,
                 reaped.lost_err == ECHILD ? "lost track of the command: wait(2) says looplock has no child"
                                           : "cannot wait for the command",
                 reaped.lost_err, "The command's process group was sent KILL.");
    }
    if (reaped.command_status) {
      end_.status = *reaped.command_status;
      leader_done_ = true;
    }
  }

  void act(const NextStep& next, Instant now) {
    switch (next.action) {
      case JobAction::Kill:
        log_.warn("kill_after",
                  end_.ended_by == JobEnd::EndedBy::Command
                      ? "the command did not end within --kill-after of the TERM/INT it was sent; sending KILL"
                  : end_.ended_by == JobEnd::EndedBy::MaxTime
                      ? "the command did not end within --kill-after of the TERM sent at --max-time; sending KILL"
                      : "the command did not end before the lease could expire; sending KILL");
        job_.kill();
        end_.signalled = true;
        kill_at_.reset();
        killed_ = true;
        return;
      case JobAction::MaxTimeTerm: {
        max_time_at_.reset();
        const auto& k = spec_.limits.max_time_kill_after;
        terminate(JobEnd::EndedBy::MaxTime, k && *k > Duration::zero() ? Deadline(later(now, *k)) : std::nullopt);
        return;
      }
      case JobAction::LeaseTerm:
        lease_live_ = false;
        end_.lease_lost = true;
        terminate(JobEnd::EndedBy::Lease, spec_.lease->kill_by());
        return;
      case JobAction::Renew:
        if (!spec_.lease->renew(next.until, job_.interrupting())) {
          // Gone for good: another host may hold the lock already, so KILL
          // comes no later than the lease's kill-after from now.
          lease_live_ = false;
          end_.lease_lost = true;
          const Duration kill_after = std::max(spec_.lease->kill_by() - spec_.lease->term_by(), Duration::zero());
          terminate(JobEnd::EndedBy::Lease, std::min(spec_.lease->kill_by(), later(MonotonicClock::now(), kill_after)));
        }
        return;
      case JobAction::Warn: warn(now); return;
      case JobAction::WarnPass:
        next_warn_pass_ = later(now, kWarnPass);
        (void)warning_->pass();
        note_warned();
        return;
      case JobAction::OuterPoll:
        next_outer_poll_ = later(now, kOuterPoll);
        if (spec_.outer_ended()) {
          // What the run runs inside has ended (a hold's tie): the job ends
          // as at --max-time, now.
          next_outer_poll_.reset();
          end_.outer_ended = true;
          log_.warn("hold_ended", "the hold this run runs inside has ended (the process it is tied to ended): "
                                  "the command is ended as at --max-time");
          max_time_at_ = now;
        }
        return;
      case JobAction::None: return;
    }
  }

  // --warn-before's signal: once due, to each process of the job that
  // catches it (warning.hpp), with one line (-q hides it); then, until the
  // TERM it warns of, every 100 ms to any that catches it by then.
  void warn(Instant now) {
    const bool by_lease = !max_time_at_ || (lease_live_ && spec_.lease->term_by() < *max_time_at_);
    const Instant term_at = by_lease ? spec_.lease->term_by() : *max_time_at_;
    const std::string sig = signal_name(spec_.limits.warn_signal);
    const std::string when =
        (by_lease ? "the lease's renewals are failing, and its TERM comes in " : "--max-time's TERM comes in ") +
        format_duration(term_at - now) + " (--warn-before)";
    const Json facts = {{"signal", sig},
                        {"term_in_ms", std::chrono::duration_cast<std::chrono::milliseconds>(term_at - now).count()}};
    end_.warned = now;
    end_.warn_signal = spec_.limits.warn_signal;
    warning_ = job_.warning(spec_.limits.warn_signal);
    if (!warning_->pass()) {
      warning_.reset();
      log_.warn("warning_not_sent",
                "did not send " + sig +
                    ": without /proc of this pid namespace looplock cannot tell which processes of the job catch it, "
                    "and it would end those that do not; " +
                    when,
                facts);
      return;
    }
    warn_until_ = term_at;
    next_warn_pass_ = later(now, kWarnPass);
    note_warned();
    const auto& sent = warning_->sent();
    const auto skipped = warning_->skipped();
    std::string to = sent.empty()
                         ? "to no process yet: none catches it"
                         : "to " + pids_text(sent) + (sent.size() > 1 ? ", which catch it" : ", which catches it");
    if (!skipped.empty())
      to += " (skipped " + pids_text(skipped) + (skipped.size() > 1 ? ", which do not)" : ", which does not)");
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
  // once; KILL by `kill_at` (none: never); and the whole group is waited for.
  void terminate(JobEnd::EndedBy by, Deadline kill_at) {
    if (!term_sent_) {
      job_.terminate();
      end_.signalled = true;
      term_sent_ = true;
      end_.term_sent = MonotonicClock::now();
    }
    if (end_.ended_by == JobEnd::EndedBy::Command) end_.ended_by = by;
    whole_group_ = true;
    kill_at_ = earliest(kill_at_, kill_at);
  }

  // Waits for a signal until `until` (none: without limit) and passes it
  // on; a TERM or INT passed on starts --kill-after.
  void pass_signal(Deadline until) {
    const auto passed = job_.pass_signal(until);
    if (!passed) return;
    end_.signalled = true;
    if (passed->asks_end && spec_.limits.kill_after && !kill_after_armed_) {
      kill_after_armed_ = true;
      whole_group_ = true;
      kill_at_ = earliest(kill_at_, later(MonotonicClock::now(), *spec_.limits.kill_after));
    }
  }

  const CommandSpec& spec_;
  const Logger& log_;
  sys::RunningJob& job_;
  JobEnd& end_;
  bool lease_live_;
  Deadline max_time_at_;
  Deadline kill_at_;               // none: no KILL planned
  bool kill_after_armed_ = false;  // a forwarded TERM/INT started --kill-after
  bool term_sent_ = false;         // looplock sent its own TERM (--max-time, the lease)
  bool whole_group_ = false;       // wait for the whole group, not only the command's first process
  bool killed_ = false;
  bool leader_done_ = false;
  std::unique_ptr<sys::JobWarning> warning_;  // once warned (and the system tells who catches the signal)
  Instant warn_until_;                        // the TERM the warning is about
  Instant next_warn_pass_;
  Deadline next_outer_poll_;  // none: nothing to look at (or it has ended)
};

}  // namespace

int exec_failure_status(int err) { return sys::exec_not_found(err) ? exit_code::kNotFound : exit_code::kNotExecutable; }

JobEnd run_command(const CommandSpec& spec, sys::JobControl& control, const Logger& log) {
  auto started = control.start({.argv = spec.argv,
                                .env = spec.env,
                                .pass_fd = spec.pass_fd,
                                .also_pass_fd = spec.also_pass_fd,
                                .shell = spec.shell});
  if (auto* f = std::get_if<sys::Failure>(&started)) start_failed(*f, spec.argv[0]);
  sys::RunningJob& job = *std::get<std::unique_ptr<sys::RunningJob>>(started);
  if (job.terminal_error() != 0) {
    log.warn("terminal", errno_message("cannot give the terminal to the command", job.terminal_error()));
  }
  JobEnd end;
  end.started = MonotonicClock::now();
  end.pgid = job.group();
  JobLoop(spec, log, job, end).run();
  return end;
}

void exec_command(const CommandSpec& spec, sys::JobControl& control) {
  start_failed(control.exec({.argv = spec.argv,
                             .env = spec.env,
                             .pass_fd = spec.pass_fd,
                             .also_pass_fd = spec.also_pass_fd,
                             .shell = spec.shell}),
               spec.argv[0]);
}

}  // namespace looplock
