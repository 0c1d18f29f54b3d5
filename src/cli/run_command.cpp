#include "cli/run_command.hpp"

#include "cli/hold.hpp"
#include "job/process_jobs.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {

// --metrics-dir: after every run that got as far as knowing its lock. A file
// that cannot be written is one warning: never another exit status.
void write_metrics(const Options& o, const RunFacts& facts, int status, long long start_wall_ms, const Logger& log) {
  if (o.metrics_dir.empty() || facts.lock_id.empty() || (o.mode != Mode::Run && o.mode != Mode::Hold)) return;
  RunMetrics m;
  m.lock_id = facts.lock_id;
  m.loop = facts.loop;
  m.operation = o.identity.operation;
  m.outcome = facts.outcome.value_or(RunOutcome::Error);
  m.exit_status = status;
  m.start_s = static_cast<double>(start_wall_ms) / 1000.0;
  m.end_s = static_cast<double>(sys::realtime_ms()) / 1000.0;
  m.wait_s = std::chrono::duration<double>(facts.waited).count();
  m.duration_s = std::chrono::duration<double>(facts.ran).count();
  if (const auto f = update_metrics_file(o.metrics_dir, m)) {
    log.warn("metrics_write_failed",
             "cannot update the metrics: " + failure_message(*f) + (f->hint.empty() ? "" : " (" + f->hint + ")"));
  }
}

}  // namespace

int run_command(Session& s) {
  Options& o = s.options;
  // Before DIR is opened: the relay never holds a lock's descriptor.
  if (!o.notify.command.empty()) s.log.set_sink(&s.notifier.emplace(o.notify, s.ctx.env, s.log));
  const auto jobs = process_jobs();
  Exit out = Run(o, s.ctx, s.log, s.facts, build_stack, *jobs).run();
  const int status = out.kind == Exit::Kind::LikeWaitStatus ? shell_status(out.value) : out.value;
  write_metrics(o, s.facts, status, s.start_wall_ms, s.log);
  s.log.set_sink(nullptr);
  if (s.notifier) s.notifier->finish();  // exit_like may not return
  if (out.kind == Exit::Kind::LikeWaitStatus) jobs->exit_like(out.value);
  return out.value;
}

int hold_command(Session& s) {
  if (const auto caller = start_hold(s.options, s.ctx, s.log)) return *caller;
  return run_command(s);
}

int ended_in_error(const Fatal& e, const Logger& log, const Options* o, bool notifying, const RunFacts& facts,
                   long long start_wall_ms) {
  log.error(e.event(), e.what(), e.hint());
  // --notify's ended, for a run that ended in an error (the command could
  // not run, a lock file refused, ...): after the error, as the run's last.
  if (notifying && o) say_ended(log, o->identity.operation, RunOutcome::Error, e.status(), facts.ran);
  if (o) write_metrics(*o, facts, e.status(), start_wall_ms, log);
  // An ending signal a coalescing waiter's seat held back, that came before
  // the error: once the error is said, looplock ends of it, as it would have.
  if (facts.seat_signal_held && sys::pending_ending_signal() != 0) sys::let_ending_signals_through();
  return e.status();
}

}  // namespace looplock
