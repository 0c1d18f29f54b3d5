// One run of looplock, as the tool's script: open DIR, acquire each lock of
// the stack in order (the cluster lock, then the local one; inside an outer
// looplock only the lock it already holds) with one conflict path, run the
// job, release the locks in reverse, and conclude once.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <vector>

#include "base/environment.hpp"
#include "base/log.hpp"
#include "job/signals.hpp"
#include "lock/lock.hpp"
#include "lock/lock_kind.hpp"
#include "lock/report.hpp"
#include "records/lock_id.hpp"
#include "records/lockfile.hpp"
#include "records/metrics.hpp"
#include "records/nesting.hpp"
#include "settings/settings.hpp"

namespace looplock {

struct Context {
  EnvList env;  // the environment looplock was started with
  pid_t pid = 0;
  long long start_ns = 0;       // CLOCK_MONOTONIC when looplock started
  long long start_wall_ms = 0;  // the same instant on the wall clock (ms since the epoch)
  // The cluster lock (--etcd): looplock-etcd's, null in looplock, which
  // hands runs with --etcd to looplock-etcd (cli/cluster_exec.hpp).
  LockKind* cluster = nullptr;
};

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

// The conclusion of a job that ran: a lost lease (76) comes first, then
// --max-time (124), then a lock file or DIR that vanished under a command
// that succeeded (74), then the command's own status.
Conclusion conclude(const JobEnd& job, bool lease_lost, bool intact);

// What a run came to, for the metrics (--metrics-dir): filled in as the run
// learns it (the lock_id stays empty when the run ended before).
struct RunFacts {
  std::string lock_id;
  std::string loop;  // DIR's base name
  long long waited_ns = 0;
  long long ran_ns = 0;               // the command's run
  std::optional<RunOutcome> outcome;  // unset: an error
};

class Run {
public:
  Run(const Options& options, const Context& context, const Logger& log, RunFacts& facts);
  // The script. Returns how looplock ends; throws Fatal for an error.
  Exit run();

private:
  void open();
  LockKind& cluster() const;
  void wait_jitter();
  std::optional<Conclusion> acquire(Lock& lock);
  JobEnd run_job();
  Conclusion release(const JobEnd& job);
  Exit finish(const Conclusion& c);

  // --once-per (ledger.hpp): the slot's checks and records.
  std::optional<Conclusion> ran_before_waiting();
  // What the ledger says of a conflict: the slot's run done, or still on
  // and holding the lock.
  struct SlotConflict {
    std::optional<RunEntry> done;
    std::optional<RunEntry> running;
  };
  SlotConflict slot_conflict(Lock& lock, const Blocker& b);
  std::optional<WaitPlan> wait_for_run(const RunEntry& run, const Blocker& b);
  std::optional<Conclusion> claim_slot();
  bool counts(const LedgerLook& look, const Lock& lock, bool locked) const;
  Conclusion already_run(const RunEntry& run, const Blocker* holding, const Lock& lock);
  RunEntry this_run() const;
  void record_end(int status);
  void abandon_locks();
  void export_deadline();

  const Options& o_;
  const Context& ctx_;
  const Logger& log_;
  RunFacts& facts_;
  Reporter reporter_;
  InheritedSignals inherited_;
  WaitPlan plan_;
  long long wait_start_ns_ = 0;  // when the first attempt starts: after --jitter
  bool nested_ = false;          // inside an outer looplock that holds this lock
  std::optional<RunEntry> claimed_;  // this run, once its start is in the run ledger
  LockDir dir_;
  LockTarget target_;
  CommandSpec spec_;
  std::vector<std::unique_ptr<Lock>> locks_;  // in the order they are taken
};

}  // namespace looplock
