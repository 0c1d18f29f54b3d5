// One lock of a run's stack (run.hpp): the local lock on DIR/.state.lock
// (local_lock.hpp), the cluster lock on etcd (etcd_lock.hpp), or, inside an
// outer looplock, the lock it already holds. A run acquires them in order
// with one conflict path, runs the job, and releases them in reverse; a new
// kind of lock is a new class here, not another branch in the run.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "environment.hpp"
#include "json.hpp"
#include "policy.hpp"
#include "spawn.hpp"
#include "verdict.hpp"

namespace looplock {

// Who is in the way of a lock that was not acquired: what the skip and
// timeout lines and the incident row say (report.hpp renders it).
struct Blocker {
  std::string what;                    // "DIR/.state.lock", or "cluster lock NAME (etcd)"
  std::string who;                     // "pid 1234 (agent cron, operation tick.py, ...)"
  std::string inspect_hint;            // the command that shows more
  std::optional<Verdict> verdict;      // the local lock's
  Json cluster = nullptr;              // the incident row's "cluster" object
  std::string confirm = "the holder";  // whom the operator confirms stalled: "pid 12", "pids 12, 13"
  bool many = false;                   // more than one of them
  std::string action_extra;            // added to the policy's operator_action
};

// One run, as a run ledger keeps it (the schedules' --once-per).
struct RunEntry {
  std::string operation;
  std::string host;
  long long pid = 0;
  std::string agent;
  std::string started_at;
  std::optional<std::string> ended_at;
  std::optional<int> exit_status;
};

// What the release of the stack found, filled in lock by lock (in reverse
// order of acquisition), for the run's conclusion and the rows about the job.
struct Ending {
  const JobEnd& job;
  std::optional<HolderRecord> record;  // this run's holder record, when it wrote one
  bool intact = true;                  // the lock file and DIR were still the ones locked
  bool lease_lost = false;             // a cluster lock's lease was lost while the job ran
};

class Lock {
public:
  virtual ~Lock() = default;

  // What can be prepared for the command before waiting (so that a hand-off
  // from the previous holder does not wait for it).
  virtual void prepare(CommandSpec& /*spec*/) {}
  // Takes the lock under `plan`, the deadline counting from `start_ns`; once
  // acquired, says so with -v.
  virtual Acquisition acquire(const WaitPlan& plan, long long start_ns) = 0;
  // After Busy or TimedOut: who holds it.
  virtual Blocker blocker() const = 0;
  // Once acquired: what it gives the command (its environment, a descriptor).
  virtual void export_to(CommandSpec& spec) = 0;
  // Its lease, when the job loop must renew it; null otherwise.
  virtual Lease* lease() { return nullptr; }
  // After the job: lets go of the lock, and notes what it found in `ending`.
  virtual void release(Ending& ending) = 0;
  // The job could not be run (a Fatal error): lets go as cleanly as it can.
  virtual void abandon() {}

  // The run ledger (--once-per): the last recorded run of `operation`, and
  // this run's start and end. A lock without a ledger has none.
  virtual std::optional<RunEntry> last_run(const std::string& /*operation*/) { return std::nullopt; }
  virtual bool record_start(const RunEntry& /*entry*/) { return true; }
  virtual void record_end(const RunEntry& /*entry*/) {}
};

}  // namespace looplock
