// One run of looplock, as the tool's script: open DIR, acquire each lock of
// the stack in order (the cluster lock, then the local one; inside an outer
// looplock only the lock it already holds) with one conflict path, run the
// job, release the locks in reverse, and conclude once.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "base/environment.hpp"
#include "base/log.hpp"
#include "lock/lock.hpp"
#include "lock/report.hpp"
#include "records/lock_id.hpp"
#include "records/lockfile.hpp"
#include "records/metrics.hpp"
#include "records/nesting.hpp"
#include "run/once_per.hpp"
#include "run/stack.hpp"
#include "settings/settings.hpp"

namespace looplock {

// How looplock ends: with an exit status, or like a wait status (exit N, or
// die of the signal that killed the command).
struct Exit {
  enum class Kind { ExitStatus, LikeWaitStatus };
  Kind kind = Kind::ExitStatus;
  int value = 0;
};

// A run's conclusion: how looplock ends, and what the metrics count.
struct Conclusion {
  Exit exit;
  RunOutcome outcome = RunOutcome::Error;
};

// The conclusion of a job that ran: a lock lost (its lease, 76) comes first, then
// --max-time (124), then a lock file or DIR that vanished under a command
// that succeeded (74), then the command's own status.
Conclusion conclude(const JobEnd& job, bool lost, bool intact);

// What a run came to, for the metrics (--metrics-dir): filled in as the run
// learns it (the lock_id stays empty when the run ended before).
struct RunFacts {
  std::string lock_id;
  std::string loop;  // DIR's base name
  Duration waited{0};
  Duration ran{0};                    // the command's run
  std::optional<RunOutcome> outcome;  // unset: an error
  // A coalescing waiter's wait ended by an ending signal, held back until
  // the run has said so: an error meanwhile ends looplock of it, once said.
  bool seat_signal_held = false;
};

class Run {
public:
  // `stack` builds the locks (build_stack() but in Run's unit tests), `jobs`
  // runs the command.
  Run(const Options& options, const Context& context, Logger& log, RunFacts& facts, StackFactory stack,
      JobRunner& jobs);
  // The script. Returns how looplock ends; throws Fatal for an error.
  Exit run();

private:
  void open();
  void wait_jitter();
  std::optional<Conclusion> acquire(Lock& lock);
  JobEnd run_job();
  Conclusion release(const JobEnd& job);
  Exit finish(const Conclusion& c);

  std::optional<Conclusion> claim_slot();
  Conclusion skipped() const;
  void abandon_locks();
  void export_deadline();

  const Options& o_;
  const LockRequest request_;  // what each lock is asked for
  const Context& ctx_;
  StackFactory stack_;
  JobRunner& jobs_;
  Logger& log_;  // the run sets its lock id once DIR is known
  RunFacts& facts_;
  Reporter reporter_;
  WaitPlan plan_;
  Instant wait_start_;           // when the first attempt starts: after --jitter
  bool nested_ = false;          // inside an outer looplock that holds this lock
  OncePer once_per_;
  LockDir dir_;
  LockTarget target_;
  CommandSpec spec_;
  std::vector<std::unique_ptr<Lock>> locks_;  // in the order they are taken
};

}  // namespace looplock
