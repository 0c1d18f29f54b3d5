#include "run/run.hpp"

#include <algorithm>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "job/job.hpp"
#include "job/next_step.hpp"
#include "os/files.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/wait_status.hpp"
#include "records/holder.hpp"
#include "records/nesting.hpp"
#include "run/notify.hpp"
#include "settings/lease_timing.hpp"

namespace looplock {

namespace {

Exit exit_status(int status) { return {Exit::Kind::ExitStatus, status}; }

RunOutcome outcome_of(int wait_status) {
  const auto ending = sys::ending_of(wait_status);
  if (ending && ending->by_signal) return RunOutcome::Signaled;
  return ending && ending->value == 0 ? RunOutcome::Success : RunOutcome::Failure;
}

}  // namespace

Conclusion conclude(const JobEnd& job, bool lost, bool intact) {
  if (lost) return {exit_status(exit_code::kLeaseLost), RunOutcome::LeaseLost};
  if (job.ended_by == JobEnd::EndedBy::MaxTime) return {exit_status(exit_code::kMaxTime), RunOutcome::MaxTime};
  const RunOutcome outcome = outcome_of(job.status);
  if (!intact && outcome == RunOutcome::Success) return {exit_status(exit_code::kVanished), RunOutcome::Error};
  return {{Exit::Kind::LikeWaitStatus, job.status}, outcome};
}

Run::Run(const Options& options, const Context& context, Logger& log, RunFacts& facts, StackFactory stack,
         JobRunner& jobs)
    : o_(options),
      request_(lock_request(options, context.start_wall_ms)),
      ctx_(context),
      stack_(std::move(stack)),
      jobs_(jobs),
      log_(log),
      facts_(facts),
      reporter_(options.dir, options.identity, options.wait.policy, context.pid, log),
      once_per_(options.once_per, options.identity, options.wait.policy, context, log, reporter_) {}

Exit Run::run() {
  open();
  wait_jitter();
  if (once_per_.ran_before_waiting(locks_)) return finish(skipped());
  for (auto& lock : locks_) {
    lock->prepare(spec_);
    if (auto conflict = acquire(*lock)) return finish(*conflict);
    lock->export_to(spec_);
    if (Lease* lease = lock->lease()) spec_.lease = lease;
  }
  for (auto& lock : locks_) lock->all_held();
  if (auto done = claim_slot()) return finish(*done);
  for (auto& lock : locks_) lock->settle_absorbed(true);
  const JobEnd job = run_job();
  const Conclusion c = release(job);
  // --notify's ended, once every lock is released (never before a hand-off).
  say_ended(log_, request_.identity.operation, c.outcome,
            c.exit.kind == Exit::Kind::LikeWaitStatus ? shell_status(c.exit.value) : c.exit.value,
            job.ended - job.started);
  return finish(c);
}

// DIR, what the lock is called, and the stack of locks to take, as the
// factory builds it (stack.hpp).
void Run::open() {
  jobs_.take_control(ctx_.pid);
  dir_ = open_lock_dir(o_.dir);
  if (auto fs = sys::network_file_system(dir_.fd.get())) {
    log_.warn("network_file_system", o_.dir + " is on a network file system (" + *fs +
                                         "): flock(2) there may not exclude processes on other hosts; looplock "
                                         "supports local file systems only");
  }
  target_ = target_of(dir_.fd.get(), o_.dir);
  facts_.lock_id = target_.lock_id;
  facts_.loop = target_.loop;
  log_.set_lock_id(target_.lock_id);
  reporter_.set_target(dir_.fd.get(), target_.lock_id);
  plan_ = wait_plan(o_.wait.policy, o_.wait.timeout);

  spec_.argv = o_.command;
  spec_.shell = o_.shell_form;
  spec_.env = ctx_.env;
  spec_.limits = o_.limits;
  wait_start_ = ctx_.start;

  Stack stack = stack_({.options = o_,
                        .request = request_,
                        .context = ctx_,
                        .log = log_,
                        .reporter = reporter_,
                        .dir = dir_,
                        .target = target_});
  locks_ = std::move(stack.locks);
  nested_ = stack.nested;
  if (nested_ && o_.mode == Mode::Hold) {
    throw Fatal(exit_code::kUsage,
                "--hold inside a run that holds " + target_.loop + "'s lock already: the hold would end with that run",
                "Take the hold outside looplock, in its own step.");
  }
}

// --jitter: a random time in [0, DURATION) before the first attempt, which
// the deadline and the wait's metric do not count. A signal ends it as it
// ends a wait. Nested runs have no jitter (the outer one had it).
void Run::wait_jitter() {
  if (!o_.once_per.jitter || nested_) return;
  const auto r = sys::random_below(static_cast<unsigned long long>(o_.once_per.jitter->count()));
  if (!r) fail_errno(exit_code::kOsError, "cannot draw --jitter's random wait (getrandom)", errno);
  const Duration jitter(static_cast<long long>(*r));
  sleep_until(later(MonotonicClock::now(), jitter));
  wait_start_ = MonotonicClock::now();
  log_.verbose("jitter",
               "waited " + format_duration(jitter) + " (--jitter " + format_duration(*o_.once_per.jitter) + ")",
               {{"jitter_ms", ms_of(jitter)}});
}

// One conflict path for every lock: a skip, or a timeout with its row (or,
// with --once-per, the holder running this slot: its end is waited for, or
// the slot's skip).
std::optional<Conclusion> Run::acquire(Lock& lock) {
  Acquisition got = lock.acquire(plan_, wait_start_);
  std::optional<Blocker> b;
  for (bool waited_for_run = false; got != Acquisition::Acquired; waited_for_run = true) {
    b = lock.blocker();
    if (got == Acquisition::Coalesced) break;
    // A coalescing waiter ended by a signal, or that absorbed runs, gives
    // up as any does (it says what it absorbed), never waits on for the
    // slot's run nor skips as it: those runs' ticks are not its own.
    const auto absorbed = b->fields.find("coalesced");
    if (b->ended_by_signal != 0 || (absorbed != b->fields.end() && *absorbed != 0)) break;
    const OncePer::Step slot = once_per_.on_conflict(lock, *b, waited_for_run, wait_start_);
    if (slot.skipped) return skipped();
    if (!slot.more) break;
    got = lock.acquire(*slot.more, wait_start_);
  }
  facts_.waited = MonotonicClock::now() - wait_start_;
  if (got == Acquisition::Acquired) return std::nullopt;
  if (got == Acquisition::Busy) {
    reporter_.skip(*b);
    return skipped();
  }
  if (got == Acquisition::Coalesced) {
    reporter_.coalesced(*b);
    return skipped();
  }
  facts_.seat_signal_held = b->ended_by_signal != 0;
  reporter_.timeout(*b, plan_, facts_.waited, o_.wait.conflict_exit_code);
  // --notify's ended after a wait that gave up (a skip ends with skipped),
  // with the runs a coalescing waiter absorbed.
  Json absorbed = Json::object();
  if (const auto it = b->fields.find("coalesced"); it != b->fields.end()) absorbed["coalesced"] = *it;
  say_ended(log_, request_.identity.operation, b->ended_by_signal != 0 ? RunOutcome::Signaled : RunOutcome::Timeout,
            b->ended_by_signal != 0 ? 128 + b->ended_by_signal : o_.wait.conflict_exit_code, Duration::zero(),
            facts_.waited, absorbed);
  if (b->ended_by_signal != 0) {
    // Said (and the row written): once the run has let go of every lock and
    // written its metrics, the signal, held back since, ends looplock as it
    // would have (exit_like).
    return Conclusion{{Exit::Kind::LikeWaitStatus, b->ended_by_signal}, RunOutcome::Signaled};
  }
  return Conclusion{exit_status(o_.wait.conflict_exit_code), RunOutcome::Timeout};
}

// The command's job, under every lock (-F: in looplock's place).
JobEnd Run::run_job() {
  try {
    export_deadline();
    if (o_.lock.no_fork) jobs_.exec(spec_);
    if (log_.has_sink())
      log_.event("info", "started", clip_bytes(request_.identity.operation) + " started under the lock",
                 {{"operation", clip_bytes(request_.identity.operation)},
                  {"agent_id", clip_bytes(request_.identity.agent)},
                  {"policy", policy_name(o_.wait.policy)}});
    if (ctx_.on_held) ctx_.on_held(spec_);
    JobEnd job = jobs_.run(spec_, log_);
    facts_.ran = job.ended - job.started;
    return job;
  } catch (const Fatal& f) {
    // A command that cannot run has had its slot (126, 127).
    if (f.status() == exit_code::kNotExecutable || f.status() == exit_code::kNotFound) {
      once_per_.record_end(locks_, f.status());
    }
    abandon_locks();
    throw;
  }
}

// LOOPLOCK_DEADLINE: when --max-time sends TERM, or the inherited deadline
// when that comes first and the looplock that set it is still a live
// ancestor (LOOPLOCK_DEADLINE_OWNER names it); removed when there is
// neither, so the command never sees a deadline that does not hold.
void Run::export_deadline() {
  const std::optional<std::string> inherited = env_get(ctx_.env, env_name::kDeadline);
  if (!inherited && !spec_.limits.max_time) return;  // nothing to set or remove (the lock is held: no copy)
  std::optional<long long> at;
  std::string owner;
  if (inherited && deadline_owner_lives(ctx_.env, ctx_.pid)) {
    at = parse_deadline(inherited);
    owner = env_get(ctx_.env, env_name::kDeadlineOwner).value_or("");
  }
  if (spec_.limits.max_time) {
    const long long own = sys::realtime_ms() + ms_of(*spec_.limits.max_time);
    if (!at || own < *at) {
      at = own;
      // /proc/self/stat: this looplock's start time, so that a later process
      // given its pid is not taken for it.
      owner = format_deadline_owner(ctx_.pid, sys::own_start().value_or(""));
    }
  }
  if (at) {
    env_set(spec_.env, {{env_name::kDeadline, format_deadline(*at)}, {env_name::kDeadlineOwner, owner}});
  } else {
    env_set(spec_.env, {}, {env_name::kDeadline, env_name::kDeadlineOwner});
  }
}

void Run::abandon_locks() {
  for (auto it = locks_.rbegin(); it != locks_.rend(); ++it) (*it)->abandon();
}

// The locks in reverse order, then the rows about a job looplock ended
// (written once it has ended, so that they can say how), then the one
// conclusion.
Conclusion Run::release(const JobEnd& job) {
  // The run's end, in the ledger, under the locks; a lost lease's run does
  // not count.
  if (!job.lease_lost) {
    once_per_.record_end(locks_,
                         job.ended_by == JobEnd::EndedBy::MaxTime ? exit_code::kMaxTime : shell_status(job.status));
  }
  Ending ending{.job = job, .record = std::nullopt, .intact = true, .lost = false};
  for (auto it = locks_.rbegin(); it != locks_.rend(); ++it) (*it)->release(ending);
  if (job.ended_by == JobEnd::EndedBy::MaxTime)
    reporter_.max_time(job, spec_.limits.max_time.value_or(Duration::zero()), ending.record, ending.leaked,
                       spec_.limits.max_time_from);
  return conclude(job, ending.lost, ending.intact);
}

// Holding every lock, the slot's run: a skip lets the locks go, then says so.
std::optional<Conclusion> Run::claim_slot() {
  try {
    if (!once_per_.claim(locks_, [this] { abandon_locks(); })) return std::nullopt;
  } catch (const Fatal&) {
    abandon_locks();
    throw;
  }
  return skipped();
}

// A skip (single_flight's, or the slot's): --skip-exit-code.
Conclusion Run::skipped() const {
  if (log_.has_sink())
    log_.event("notice", "skipped", clip_bytes(request_.identity.operation) + " skipped",
               {{"operation", clip_bytes(request_.identity.operation)}, {"exit_status", o_.wait.skip_exit_code}});
  return {exit_status(o_.wait.skip_exit_code), RunOutcome::Skipped};
}

Exit Run::finish(const Conclusion& c) {
  facts_.outcome = c.outcome;
  return c.exit;
}

}  // namespace looplock
