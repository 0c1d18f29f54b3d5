#include "run/once_per.hpp"

#include <algorithm>
#include <chrono>

#include "base/duration.hpp"
#include "base/text.hpp"
#include "os/clock.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "records/run_entry.hpp"

namespace looplock {

namespace {

// A dead holder's lease lives at most its TTL: the extra wait for it to
// expire, and for the queue to move.
constexpr Duration kLeaseSlack = std::chrono::seconds(2);

}  // namespace

OncePer::OncePer(const OncePerSettings& settings, const Identity& identity, Policy policy, const Context& context,
                 const Logger& log, const Reporter& reporter)
    : settings_(settings), identity_(identity), policy_(policy), ctx_(context), log_(log), reporter_(reporter) {}

// This run as the ledgers record it: who (with what tells its looplock
// apart on this host: its start time, the boot, the pid namespace), when,
// and its slot's length.
RunEntry OncePer::this_run() const {
  RunEntry e;
  e.operation = identity_.operation;
  e.host = sys::host_name();
  e.pid = ctx_.pid;
  e.agent = identity_.agent;
  e.started_ms = ctx_.start_wall_ms;
  e.once_per_ms = ms_of(*settings_.period);
  e.pid_start = sys::own_start().value_or("");
  e.boot_id = sys::boot_id();
  e.pid_ns = sys::pid_namespace();
  return e;
}

// Whether a ledger's look shows a run that had this slot: one that started
// within DURATION of this looplock's start and ended. What looks wrong is
// said once, by the locked read (a damaged entry, a start beyond DURATION in
// the future), and a start in the future that counts whenever it skips (the
// hosts' clocks differ).
bool OncePer::counts(const LedgerLook& look, const Ledger& l, bool locked, long long at_ms) const {
  const std::string ledger = l.name();
  if (look.damaged && locked) {
    log_.warn("ledger_damaged",
              look.whole ? ledger +
                               " is not a run ledger (a write cut short, or another file): no operation's entry "
                               "counts, so each may run again in its slot; this run rewrites it"
                         : ledger + ": the entry of " + quote(identity_.operation) +
                               " is damaged; it does not count, and this run rewrites it");
  }
  const SlotVerdict v = judge_slot(look.entry, at_ms, ms_of(*settings_.period));
  if ((v.slot == Slot::Damaged && locked) || (v.ahead_ms > 0 && v.slot == Slot::Done)) {
    const bool counted = v.slot != Slot::Damaged;
    // One host's entry ahead of its own clock: that clock was set back.
    const std::string why = look.entry->host == sys::host_name()
                                ? "this host's clock was set back by about that much since that run started"
                                : "the hosts' clocks differ by that much";
    log_.warn("ledger_ahead",
              ledger + ": the last run of " + quote(identity_.operation) + " started " +
                  format_duration(of_ms(v.ahead_ms)) + " after this looplock started, by this host's clock: " + why +
                  "; " + (counted ? "it counts (it is within --once-per)" : "it does not count (beyond --once-per)"),
              {{"ahead_ms", v.ahead_ms}, {"counted", counted}});
  }
  return v.slot == Slot::Done;
}

bool OncePer::already_run(const RunEntry& run, const Blocker* holding, const Ledger& l) const {
  reporter_.already_run(run, *settings_.period, holding, l.name());
  return true;
}

// Before waiting: a slot already run skips at once, without queueing (a look
// without the lock; the locked read stays the authority).
bool OncePer::ran_before_waiting(const Locks& locks) const {
  if (!settings_.period) return false;
  for (const auto& lock : locks) {
    Ledger* l = lock->ledger();
    if (!l) continue;
    const LedgerLook look = l->look(identity_.operation, false);
    if (look.answered && counts(look, *l, false, ctx_.start_wall_ms)) return already_run(*look.entry, nullptr, *l);
  }
  return false;
}

// A wait that ended while the holder is running this slot (or has just run
// it) is about the slot, not a conflict: its run done is the slot's skip;
// its run still on (the holder's own) is waited for.
OncePer::SlotConflict OncePer::slot_conflict(Ledger& l, const Blocker& b) const {
  const LedgerLook look = l.look(identity_.operation, false);
  if (!look.answered || !look.entry) return {};
  const RunEntry& e = *look.entry;
  const SlotVerdict v = judge_slot(e, ctx_.start_wall_ms, ms_of(*settings_.period));
  if (v.slot == Slot::Done && counts(look, l, false, ctx_.start_wall_ms)) return {e, std::nullopt};
  const bool holder =
      std::any_of(b.holder_ids.begin(), b.holder_ids.end(), [&](const HolderId& h) { return h.names(e); });
  if (v.slot == Slot::Running && holder) return {std::nullopt, e};
  return {};
}

// The slot's run holds the lock and has not recorded its end: it may end
// well (then this run skips), or may have crashed (then this run must run
// it), so a waiter waits on past -w, until the lock is free or the slot is
// over (--once-per from this looplock's start). A runner proven dead on
// this host shortens that to its lease's expiry; single_flight waits only
// for such a one. nullopt: the slot's skip now.
std::optional<WaitPlan> OncePer::wait_for_run(const RunEntry& run, const Blocker& b, Instant wait_start) const {
  const Instant now = MonotonicClock::now();
  Instant until = later(ctx_.start, *settings_.period);
  const bool dead = runner_proven_dead(run);
  if (dead) {
    const auto h =
        std::find_if(b.holder_ids.begin(), b.holder_ids.end(), [&](const HolderId& x) { return x.names(run); });
    if (h != b.holder_ids.end() && h->lease_ttl_s > 0) {
      until = std::min(until, later(now, std::chrono::seconds(h->lease_ttl_s) + kLeaseSlack));
    }
  }
  if ((!dead && policy_ == Policy::SingleFlight) || now >= until) return std::nullopt;
  log_.verbose("waiting",
               "waiting past the deadline for the slot's run, " + describe_run(run) + ": " + b.what + " is held by " +
                   b.who +
                   (dead ? "; that run's looplock is dead, so this run takes the slot once the lock is free"
                         : "; this run skips once it has recorded its end, or takes the slot if it never does") +
                   " (at most " + format_duration(until - now) + ")",
               {{"policy", policy_name(policy_)}});
  return WaitPlan{WaitPlan::Kind::Bounded, until - wait_start};
}

// Holding every lock: the locked reads decide. A run that had the slot
// skips (the locks are let go); otherwise this run's start is recorded in
// each ledger (etcd first) before the command starts.
bool OncePer::claim(const Locks& locks, const std::function<void()>& let_go) {
  if (!settings_.period) return false;
  // -p coalesce: a waiter runs for the runs it absorbed, so it is judged by
  // the newest start among them and its own (one that came late may be due
  // when the waiter's own start is not), and records that instant.
  long long at_ms = ctx_.start_wall_ms;
  for (const auto& lock : locks) {
    if (const auto absorbed = lock->absorbed_start_ms()) at_ms = std::max(at_ms, *absorbed);
  }
  const auto skip = [&](const RunEntry& run, const Blocker* holding, const Ledger& by) {
    for (const auto& lock : locks) {
      if (Ledger* l = lock->ledger()) l->end_claim();
      lock->settle_absorbed(false);  // judged by their newest start: the slot's run did their work
    }
    let_go();
    return already_run(run, holding, by);
  };
  for (const auto& lock : locks) {
    Ledger* l = lock->ledger();
    if (!l) continue;
    const LedgerLook look = l->look(identity_.operation, true);
    if (counts(look, *l, true, at_ms)) return skip(*look.entry, nullptr, *l);
    // Under the local lock, a start without an end is a crashed run's,
    // unless its looplock is alive here: then it holds the lock with this
    // one, a run nested in the same holder (or a step of the same hold),
    // and runs the slot now.
    if (l->shared_by_nested_runs() && look.entry &&
        judge_slot(look.entry, at_ms, ms_of(*settings_.period)).slot == Slot::Running &&
        runner_alive_here(*look.entry)) {
      Blocker sharing;
      sharing.what = "the lock this run is nested in";
      sharing.who = "the same holder as this run (pid " + std::to_string(look.entry->pid) + " runs inside it too)";
      return skip(*look.entry, &sharing, *l);
    }
  }
  RunEntry me = this_run();
  me.started_ms = at_ms;
  for (const auto& lock : locks) {
    if (Ledger* l = lock->ledger()) l->record_start(me);
  }
  claimed_ = me;
  return false;
}

// The run's end in each ledger, in order; after a failure the rest are not
// written (the run does not count).
void OncePer::record_end(const Locks& locks, int status) {
  if (!claimed_) return;
  RunEntry me = *claimed_;
  me.ended_ms = sys::realtime_ms();
  me.exit_status = status;
  for (const auto& lock : locks) {
    Ledger* l = lock->ledger();
    if (l && !l->record_end(me)) return;
  }
}

// A wait that ended without the lock: the slot's skip, a longer wait for
// the slot's run, or a conflict like any other.
OncePer::Step OncePer::on_conflict(Lock& lock, const Blocker& b, bool waited_for_run, Instant wait_start) const {
  Ledger* l = settings_.period ? lock.ledger() : nullptr;
  if (!l) return {};
  const SlotConflict c = slot_conflict(*l, b);
  if (c.done) return {.skipped = already_run(*c.done, nullptr, *l), .more = std::nullopt};
  if (!c.running) return {};
  const std::optional<WaitPlan> more = waited_for_run ? std::nullopt : wait_for_run(*c.running, b, wait_start);
  if (!more) return {.skipped = already_run(*c.running, &b, *l), .more = std::nullopt};
  return {.skipped = false, .more = more};
}

}  // namespace looplock
