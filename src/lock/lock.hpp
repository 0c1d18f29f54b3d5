// One lock of a run's stack (run.hpp): the local lock on DIR/.state.lock
// (local_lock.hpp), the cluster lock on etcd (etcd_lock.hpp), or, inside an
// outer looplock, the lock it already holds. A run acquires them in order
// with one conflict path, runs the job, and releases them in reverse; a new
// kind of lock is a new class here, not another branch in the run.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/environment.hpp"
#include "base/json.hpp"
#include "base/policy.hpp"
#include "job/job.hpp"
#include "os/ids.hpp"
#include "records/holder.hpp"
#include "records/run_entry.hpp"

namespace looplock {

// A process that holds a lock, as a run ledger's entry names its runner:
// for matching the two (a pid_start that either side left empty matches
// any), and, for a lease, how long it can outlive a dead holder.
struct HolderId {
  std::string host;
  long long pid = 0;
  std::string pid_start;
  int lease_ttl_s = 0;  // the cluster lock's holder: its lease's TTL (0: none, or unknown)
  bool names(const RunEntry& e) const {
    return host == e.host && pid == e.pid && (pid_start.empty() || e.pid_start.empty() || pid_start == e.pid_start);
  }
};

// What a lock knows of the processes holding it, for the incident row and
// the line's fields: each kind fills what it can tell (the local lock from
// its verdict, verdict.hpp); what is left empty is written as none.
struct HolderFacts {
  std::vector<Pid> pids;              // the processes the system shows holding it
  std::optional<HolderRecord> holder;   // the holder's record, when it is the current holder's
  std::optional<bool> holder_alive;     // whether that record's process lives
  std::string record_status;            // the record's state ("current", "stale", ...); empty: no record kept
  std::optional<HolderRecord> record;   // a record read that is not the current holder's
  std::vector<std::string> warnings;    // what is wrong with the lock's files
};

// Who is in the way of a lock that was not acquired: what the skip and
// timeout lines and the incident row say (report.hpp renders it, whatever
// the kind of lock).
struct Blocker {
  std::string what;                    // "DIR/.state.lock", or "cluster lock NAME (etcd)"
  // When a waiter gets in, when that is not "<what> is free" (--holders:
  // "one of the holder indexes of DIR/.state.lock (--holders 2) is free").
  std::string frees_when;
  std::string who;                     // "pid 1234 (agent cron, operation tick.py, ...)"
  std::string inspect_hint;            // the command that shows more
  HolderFacts holders;
  // The kind's own fields of the row and the line, each under its key
  // (the cluster lock's: {"cluster": {...}}).
  Json fields = Json::object();
  std::string confirm = "the holder";  // whom the operator confirms stalled: "pid 12", "pids 12, 13"
  bool many = false;                   // more than one of them
  std::string action_extra;            // added to the policy's operator_action
  // The holders, for matching the run ledger's entry.
  std::vector<HolderId> holder_ids;
  // -p coalesce, a Coalesced acquisition: the run of this operation that
  // waits for the lock, which absorbed this one ("pid 12 (agent cron,
  // waiting since T)"; its record under fields' "coalesce").
  std::string waiting;
  // TimedOut by a signal (INT, TERM, HUP, QUIT) that came while this run
  // waited in a coalesce seat: the run says what it absorbed, then ends of
  // that signal. 0: the deadline passed.
  int ended_by_signal = 0;
};

// What the release of the stack found, filled in lock by lock (in reverse
// order of acquisition), for the run's conclusion and the rows about the job.
struct Ending {
  const JobEnd& job;
  std::optional<HolderRecord> record;  // this run's holder record, when it wrote one
  bool intact = true;                  // the lock file and DIR were still the ones locked
  bool lost = false;                   // a lock was lost while the job ran (its lease ended): 76
  bool leaked = false;                 // a process the job left (outside its group) still holds a lock
};

// A run ledger (--once-per): the last run of each operation, kept by a lock
// that offers one (Lock::ledger()). Its entry of an operation is read without
// the lock (before waiting, or once a wait ended) or holding it (`locked`:
// the authority; a ledger that cannot be read then is a Fatal error); this
// run's start is recorded before the command starts (Fatal when it cannot
// be), its end after (false when it could not be recorded: the run then
// does not count).
class Ledger {
public:
  virtual ~Ledger() = default;
  virtual LedgerLook look(const std::string& operation, bool locked) = 0;
  virtual void record_start(const RunEntry& entry) = 0;
  // A locked look (look(..., true)) keeps the ledger as it found it, for
  // this run alone, until record_start() or end_claim(): runs nested in one
  // holder share its lock, and each one's look and record must be one step.
  virtual void end_claim() {}
  // Whether a start without an end that a locked look finds, its looplock
  // alive on this host, is a run on now: so for a ledger whose lock runs
  // nested in one holder share (the local one); not for a cluster ledger,
  // where such a looplock may have lost its lease (stopped, cut off) and
  // its slot is another's to run.
  virtual bool shared_by_nested_runs() const { return false; }
  virtual bool record_end(const RunEntry& entry) = 0;
  // Where it is, for messages: "run ledger DIR/.state.lock.runs.json".
  virtual std::string name() const = 0;
};

class Lock {
public:
  virtual ~Lock() = default;

  // What can be prepared for the command before waiting (so that a hand-off
  // from the previous holder does not wait for it).
  virtual void prepare(CommandSpec& /*spec*/) {}
  // Takes the lock under `plan`, the deadline counting from `start`; once
  // acquired, says so with -v.
  virtual Acquisition acquire(const WaitPlan& plan, Instant start) = 0;
  // After Busy, TimedOut or Coalesced: who holds it (and, Coalesced, who
  // waits for it).
  virtual Blocker blocker() const = 0;
  // Once acquired: what it gives the command (its environment, a descriptor).
  virtual void export_to(CommandSpec& spec) = 0;
  // Every lock of the run is held: the command is to run (or --once-per to
  // judge it). -p coalesce: the runs this one absorbed are read.
  virtual void all_held() {}
  // -p coalesce: the run does the work of the runs it absorbed (`runs`: its
  // command starts; else its slot's run did it, --once-per).
  virtual void settle_absorbed(bool /*runs*/) {}
  // Its lease, when the job loop must renew it; null otherwise.
  virtual Lease* lease() { return nullptr; }
  // After the job: lets go of the lock, and notes what it found in `ending`.
  virtual void release(Ending& ending) = 0;
  // The job could not be run (a Fatal error): lets go as cleanly as it can.
  virtual void abandon() {}

  // The run ledger this lock keeps for this run (--once-per), or null.
  virtual Ledger* ledger() { return nullptr; }
  // -p coalesce, acquired by the run that waited in the seat: the newest
  // start (wall clock, ms since the epoch) of the runs it absorbed, by which
  // --once-per judges and records it (one absorbed late enough may be due
  // when the waiter's own start is not).
  virtual std::optional<long long> absorbed_start_ms() { return std::nullopt; }
};

}  // namespace looplock
