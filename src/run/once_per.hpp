// --once-per: the slot's checks and records, which the run's script calls at
// four named points (run.hpp), each a no-op without --once-per:
//   ran_before_waiting()  a slot a ledger shows run skips at once, unqueued;
//   on_conflict()         a wait that ended while the slot's run holds the
//                         lock: its end is waited for, or the slot skipped;
//   claim()               holding every lock, the locked reads decide; this
//                         run's start is recorded in each ledger;
//   record_end()          the run's end, in each ledger in order.
// The ledgers are the ones the locks offer (lock.hpp's Ledger); a skip is
// said (noop-already-run) before it is returned.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/log.hpp"
#include "base/policy.hpp"
#include "lock/lock.hpp"
#include "lock/report.hpp"
#include "records/run_entry.hpp"
#include "run/stack.hpp"
#include "settings/settings.hpp"

namespace looplock {

class OncePer {
public:
  using Locks = std::vector<std::unique_ptr<Lock>>;

  // `settings.period` set: --once-per was asked for (else each call is
  // a no-op: nothing ran before, nothing is claimed or recorded).
  OncePer(const OncePerSettings& settings, const Identity& identity, Policy policy, const Context& context,
          const Logger& log, const Reporter& reporter);

  // Before waiting: true when this slot's run is done (the skip was said).
  bool ran_before_waiting(const Locks& locks) const;
  // A wait for `lock` ended without it, `b` in the way: the skip (said), a
  // further wait (its plan), or neither (a conflict like any other).
  struct Step {
    bool skipped = false;
    std::optional<WaitPlan> more;
  };
  Step on_conflict(Lock& lock, const Blocker& b, bool waited_for_run, Instant wait_start) const;
  // Holding every lock: true when a run had the slot (the skip was said,
  // once `let_go` has let the locks go); else this run's start is recorded
  // (Fatal when it cannot be).
  bool claim(const Locks& locks, const std::function<void()>& let_go);
  // The end of a run claim() recorded, with its exit status.
  void record_end(const Locks& locks, int status);

private:
  struct SlotConflict {
    std::optional<RunEntry> done;
    std::optional<RunEntry> running;
  };
  SlotConflict slot_conflict(Ledger& l, const Blocker& b) const;
  std::optional<WaitPlan> wait_for_run(const RunEntry& run, const Blocker& b, Instant wait_start) const;
  // `at_ms`: the start it is judged by (wall clock, ms).
  bool counts(const LedgerLook& look, const Ledger& l, bool locked, long long at_ms) const;
  bool already_run(const RunEntry& run, const Blocker* holding, const Ledger& l) const;
  RunEntry this_run() const;

  const OncePerSettings& settings_;
  const Identity& identity_;
  Policy policy_;
  const Context& ctx_;
  const Logger& log_;
  const Reporter& reporter_;
  std::optional<RunEntry> claimed_;  // this run, once its start is in the ledgers
};

}  // namespace looplock
