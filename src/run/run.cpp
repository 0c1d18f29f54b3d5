#include "run/run.hpp"

#include <sys/wait.h>

#include <algorithm>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "job/spawn.hpp"
#include "job/supervisor.hpp"
#include "local/local_lock.hpp"
#include "os/procfs.hpp"
#include "os/sys.hpp"
#include "records/nesting.hpp"
#include "settings/lease.hpp"

namespace looplock {

namespace {

// A dead holder's lease lives at most its TTL: the extra wait for it to
// expire, and for the queue to move.
constexpr long long kLeaseSlackNs = 2'000'000'000LL;

Exit exit_status(int status) { return {Exit::Kind::ExitStatus, status}; }

RunOutcome outcome_of(int wait_status) {
  if (WIFSIGNALED(wait_status)) return RunOutcome::Signaled;
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0 ? RunOutcome::Success : RunOutcome::Failure;
}

}  // namespace

Conclusion conclude(const JobEnd& job, bool lease_lost, bool intact) {
  if (lease_lost) return {exit_status(exit_code::kLeaseLost), RunOutcome::LeaseLost};
  if (job.ended_by == JobEnd::EndedBy::MaxTime) return {exit_status(exit_code::kMaxTime), RunOutcome::MaxTime};
  const RunOutcome outcome = outcome_of(job.status);
  if (!intact && outcome == RunOutcome::Success) return {exit_status(exit_code::kVanished), RunOutcome::Error};
  return {{Exit::Kind::LikeWaitStatus, job.status}, outcome};
}

Run::Run(const Options& options, const Context& context, const Logger& log, RunFacts& facts)
    : o_(options), ctx_(context), log_(log), facts_(facts), reporter_(options, context.pid, log) {}

Exit Run::run() {
  open();
  wait_jitter();
  if (auto done = ran_before_waiting()) return finish(*done);
  for (auto& lock : locks_) {
    lock->prepare(spec_);
    if (auto conflict = acquire(*lock)) return finish(*conflict);
    lock->export_to(spec_);
    if (Lease* lease = lock->lease()) spec_.lease = lease;
  }
  if (auto done = claim_slot()) return finish(*done);
  const JobEnd job = run_job();
  return finish(release(job));
}

// DIR, what the lock is called, and the stack of locks to take: inside an
// outer looplock that holds this lock, only that one (it is held already);
// else the cluster lock first and the local one second, always in that
// order, so that two hosts never wait for each other crosswise.
void Run::open() {
  inherited_ = take_signal_control(ctx_.pid);
  dir_ = open_lock_dir(o_.dir);
  if (auto fs = network_file_system(dir_.fd.get())) {
    log_.warn("network_file_system", o_.dir + " is on a network file system (" + *fs +
                                         "): flock(2) there may not exclude processes on other hosts; looplock "
                                         "supports local file systems only");
  }
  target_ = target_of(dir_.fd.get(), o_.dir);
  facts_.lock_id = target_.lock_id;
  facts_.loop = target_.loop;
  log_.set_lock_id(target_.lock_id);
  reporter_.set_target(dir_.fd.get(), target_.lock_id);
  plan_ = wait_plan(o_.policy, o_.timeout_ns);

  spec_.argv = o_.command;
  spec_.env = ctx_.env;
  spec_.kill_after_ns = o_.signal_kill_after_ns;
  spec_.max_time_ns = o_.max_time_ns;
  spec_.max_time_kill_after_ns = o_.max_time_kill_after_ns;
  spec_.warn_before_ns = o_.warn_before_ns;
  spec_.warn_signal = o_.warn_signal;
  wait_start_ns_ = ctx_.start_ns;

  struct stat lock_file {};
  if (auto outer = outer_holder(o_, ctx_.env, dir_, ctx_.pid, lock_file)) {
    if (!o_.etcd.empty()) cluster().confirm_outer(o_, target_, ctx_.env, outer->pid != 0 ? outer->pid : ctx_.pid, log_);
    locks_.push_back(std::make_unique<InheritedLock>(o_, log_, dir_, *outer, lock_file));
    nested_ = true;
    return;
  }
  if (!o_.etcd.empty()) locks_.push_back(cluster().make(o_, target_, ctx_.pid, log_, reporter_));
  locks_.push_back(std::make_unique<LocalLock>(o_, ctx_.pid, log_, dir_, target_));
}

LockKind& Run::cluster() const {
  if (!ctx_.cluster) throw Fatal(exit_code::kOsError, "internal error: an --etcd run without the cluster lock");
  return *ctx_.cluster;
}

// --jitter: a random time in [0, DURATION) before the first attempt, which
// the deadline and the wait's metric do not count. A signal ends it as it
// ends a wait. Nested runs have no jitter (the outer one had it).
void Run::wait_jitter() {
  if (!o_.jitter_ns || nested_) return;
  const auto r = sys::random_below(static_cast<unsigned long long>(*o_.jitter_ns));
  if (!r) fail_errno(exit_code::kOsError, "cannot draw --jitter's random wait (getrandom)", errno);
  const long long jitter = static_cast<long long>(*r);
  sys::sleep_until_ns(sys::monotonic_ns() + jitter);
  wait_start_ns_ = sys::monotonic_ns();
  log_.verbose("jitter", "waited " + format_duration(jitter) + " (--jitter " + format_duration(*o_.jitter_ns) + ")",
               {{"jitter_ms", jitter / 1'000'000}});
}

// One conflict path for every lock: a skip, or a timeout with its row (or,
// with --once-per, the holder running this slot: its end is waited for, or
// the slot's skip).
std::optional<Conclusion> Run::acquire(Lock& lock) {
  Acquisition got = lock.acquire(plan_, wait_start_ns_);
  std::optional<Blocker> b;
  for (bool waited_for_run = false; got != Acquisition::Acquired; waited_for_run = true) {
    b = lock.blocker();
    const SlotConflict c = slot_conflict(lock, *b);
    if (c.done) return already_run(*c.done, nullptr, lock);
    if (!c.running) break;
    const std::optional<WaitPlan> more = waited_for_run ? std::nullopt : wait_for_run(*c.running, *b);
    if (!more) return already_run(*c.running, &*b, lock);
    got = lock.acquire(*more, wait_start_ns_);
  }
  facts_.waited_ns = sys::monotonic_ns() - wait_start_ns_;
  if (got == Acquisition::Acquired) return std::nullopt;
  if (got == Acquisition::Busy) {
    reporter_.skip(*b);
    return Conclusion{exit_status(o_.skip_exit_code), RunOutcome::Skipped};
  }
  reporter_.timeout(*b, plan_, facts_.waited_ns);
  return Conclusion{exit_status(o_.conflict_exit_code), RunOutcome::Timeout};
}

// The command's job, under every lock (-F: in looplock's place).
JobEnd Run::run_job() {
  try {
    export_deadline();
    if (o_.no_fork) exec_command(spec_, inherited_);
    JobEnd job = run_command(spec_, inherited_, log_, ctx_.pid);
    facts_.ran_ns = job.ended_ns - job.started_ns;
    return job;
  } catch (const Fatal& f) {
    // A command that cannot run has had its slot (126, 127).
    if (f.status() == exit_code::kNotExecutable || f.status() == exit_code::kNotFound) record_end(f.status());
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
  if (!inherited && !o_.max_time_ns) return;  // nothing to set or remove (the lock is held: no copy)
  std::optional<long long> at;
  std::string owner;
  if (inherited && deadline_owner_lives(ctx_.env, ctx_.pid)) {
    at = parse_deadline(inherited);
    owner = env_get(ctx_.env, env_name::kDeadlineOwner).value_or("");
  }
  if (o_.max_time_ns) {
    const long long own = sys::realtime_ms() + *o_.max_time_ns / 1'000'000;
    if (!at || own < *at) {
      at = own;
      // /proc/self/stat: this looplock's start time, so that a later process
      // given its pid is not taken for it.
      owner = format_deadline_owner(ctx_.pid, procfs::own_start().value_or(""));
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
    record_end(job.ended_by == JobEnd::EndedBy::MaxTime ? exit_code::kMaxTime : shell_status(job.status));
  }
  Ending ending{job, std::nullopt, true, false};
  for (auto it = locks_.rbegin(); it != locks_.rend(); ++it) (*it)->release(ending);
  if (job.ended_by == JobEnd::EndedBy::MaxTime) reporter_.max_time(job, ending.record);
  return conclude(job, ending.lease_lost, ending.intact);
}

Exit Run::finish(const Conclusion& c) {
  facts_.outcome = c.outcome;
  return c.exit;
}

// --- once per slot (--once-per) ------------------------------------------------

// This run as the ledgers record it: who (with what tells its looplock
// apart on this host: its start time, the boot, the pid namespace), when,
// and its slot's length.
RunEntry Run::this_run() const {
  RunEntry e;
  e.operation = o_.operation;
  e.host = sys::host_name();
  e.pid = ctx_.pid;
  e.agent = o_.agent;
  e.started_ms = ctx_.start_wall_ms;
  e.once_per_ms = *o_.once_per_ns / 1'000'000;
  e.pid_start = procfs::own_start().value_or("");
  e.boot_id = procfs::boot_id();
  e.pid_ns = procfs::pid_namespace();
  return e;
}

// Whether a ledger's look shows a run that had this slot: one that started
// within DURATION of this looplock's start and ended. What looks wrong is
// said once, by the locked read (a damaged entry, a start beyond DURATION in
// the future), and a start in the future that counts whenever it skips (the
// hosts' clocks differ).
bool Run::counts(const LedgerLook& look, const Lock& lock, bool locked) const {
  const std::string ledger = lock.ledger_name();
  if (look.damaged && locked) {
    log_.warn("ledger_damaged",
              look.whole ? ledger + " is not a run ledger (a write cut short, or another file): no operation's entry "
                                    "counts, so each may run again in its slot; this run rewrites it"
                         : ledger + ": the entry of " + quote(o_.operation) +
                               " is damaged; it does not count, and this run rewrites it");
  }
  const SlotVerdict v = judge_slot(look.entry, ctx_.start_wall_ms, *o_.once_per_ns / 1'000'000);
  if ((v.slot == Slot::Damaged && locked) || (v.ahead_ms > 0 && v.slot == Slot::Done)) {
    const bool counted = v.slot != Slot::Damaged;
    // One host's entry ahead of its own clock: that clock was set back.
    const std::string why = look.entry->host == sys::host_name()
                                ? "this host's clock was set back by about that much since that run started"
                                : "the hosts' clocks differ by that much";
    log_.warn("ledger_ahead",
              ledger + ": the last run of " + quote(o_.operation) + " started " +
                  format_duration(v.ahead_ms * 1'000'000) + " after this looplock started, by this host's clock: " +
                  why + "; " + (counted ? "it counts (it is within --once-per)" : "it does not count (beyond --once-per)"),
              {{"ahead_ms", v.ahead_ms}, {"counted", counted}});
  }
  return v.slot == Slot::Done;
}

Conclusion Run::already_run(const RunEntry& run, const Blocker* holding, const Lock& lock) {
  reporter_.already_run(run, holding, lock.ledger_name());
  return Conclusion{exit_status(o_.skip_exit_code), RunOutcome::Skipped};
}

// Before waiting: a slot already run skips at once, without queueing (a look
// without the lock; the locked read stays the authority).
std::optional<Conclusion> Run::ran_before_waiting() {
  if (!o_.once_per_ns) return std::nullopt;
  for (auto& lock : locks_) {
    if (!lock->has_ledger()) continue;
    const LedgerLook look = lock->look_ledger(o_.operation, false);
    if (look.answered && counts(look, *lock, false)) return already_run(*look.entry, nullptr, *lock);
  }
  return std::nullopt;
}

// A wait that ended while the holder is running this slot (or has just run
// it) is about the slot, not a conflict: its run done is the slot's skip;
// its run still on (the holder's own) is waited for.
Run::SlotConflict Run::slot_conflict(Lock& lock, const Blocker& b) {
  if (!o_.once_per_ns || !lock.has_ledger()) return {};
  const LedgerLook look = lock.look_ledger(o_.operation, false);
  if (!look.answered || !look.entry) return {};
  const RunEntry& e = *look.entry;
  const SlotVerdict v = judge_slot(e, ctx_.start_wall_ms, *o_.once_per_ns / 1'000'000);
  if (v.slot == Slot::Done && counts(look, lock, false)) return {e, std::nullopt};
  const bool holder = std::any_of(b.holder_ids.begin(), b.holder_ids.end(), [&](const HolderId& h) { return h.names(e); });
  if (v.slot == Slot::Running && holder) return {std::nullopt, e};
  return {};
}

// The slot's run holds the lock and has not recorded its end: it may end
// well (then this run skips), or may have crashed (then this run must run
// it), so a waiter waits on past -w, until the lock is free or the slot is
// over (--once-per from this looplock's start). A runner proven dead on
// this host shortens that to its lease's expiry; single_flight waits only
// for such a one. nullopt: the slot's skip now.
std::optional<WaitPlan> Run::wait_for_run(const RunEntry& run, const Blocker& b) {
  const long long now = sys::monotonic_ns();
  long long until = later(ctx_.start_ns, *o_.once_per_ns);
  const bool dead = runner_proven_dead(run);
  if (dead) {
    const auto h = std::find_if(b.holder_ids.begin(), b.holder_ids.end(), [&](const HolderId& x) { return x.names(run); });
    if (h != b.holder_ids.end() && h->lease_ttl_s > 0) {
      until = std::min(until, later(now, static_cast<long long>(h->lease_ttl_s) * 1'000'000'000LL + kLeaseSlackNs));
    }
  }
  if ((!dead && o_.policy == Policy::SingleFlight) || now >= until) return std::nullopt;
  log_.verbose("waiting",
               "waiting past the deadline for the slot's run, " + describe_run(run) + ": " + b.what + " is held by " +
                   b.who +
                   (dead ? "; that run's looplock is dead, so this run takes the slot once the lock is free"
                         : "; this run skips once it has recorded its end, or takes the slot if it never does") +
                   " (at most " + format_duration(until - now) + ")",
               {{"policy", policy_name(o_.policy)}});
  return WaitPlan{WaitPlan::Kind::Bounded, until - wait_start_ns_};
}

// Holding every lock: the locked reads decide. A run that had the slot
// skips (the locks are let go); otherwise this run's start is recorded in
// each ledger (etcd first) before the command starts.
std::optional<Conclusion> Run::claim_slot() {
  if (!o_.once_per_ns) return std::nullopt;
  try {
    for (auto& lock : locks_) {
      if (!lock->has_ledger()) continue;
      const LedgerLook look = lock->look_ledger(o_.operation, true);
      if (counts(look, *lock, true)) {
        abandon_locks();
        return already_run(*look.entry, nullptr, *lock);
      }
    }
    const RunEntry me = this_run();
    for (auto& lock : locks_) {
      if (lock->has_ledger()) lock->record_start(me);
    }
    claimed_ = me;
  } catch (const Fatal&) {
    abandon_locks();
    throw;
  }
  return std::nullopt;
}

// The run's end in each ledger, in order; after a failure the rest are not
// written (the run does not count).
void Run::record_end(int status) {
  if (!claimed_) return;
  RunEntry me = *claimed_;
  me.ended_ms = sys::realtime_ms();
  me.exit_status = status;
  for (auto& lock : locks_) {
    if (lock->has_ledger() && !lock->record_end(me)) return;
  }
}

}  // namespace looplock
