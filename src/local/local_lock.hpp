// The local lock of a run (lock.hpp): flock(2) on DIR/.state.lock under the
// policy's wait plan, the holder record written while it is held, and what
// the release finds (the lock file still in place, processes that keep the
// descriptor). And the lock a nested looplock runs under: the outer
// looplock's, already held.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/log.hpp"
#include "lock/lock.hpp"
#include "os/file_status.hpp"
#include "os/ids.hpp"
#include "os/lock_holders.hpp"
#include "records/lock_id.hpp"
#include "records/ledger.hpp"
#include "records/lockfile.hpp"
#include "records/nesting.hpp"
#include "settings/settings.hpp"

namespace looplock {

// The local run ledger, DIR/.state.lock.runs.json (ledger.hpp), as the local
// lock and a nested run's inherited lock offer it.
class LocalLedger final : public Ledger {
public:
  LocalLedger(const LockDir& dir, std::string dir_shown, const Logger& log)
      : dir_(dir), shown_(std::move(dir_shown)), log_(log) {}
  LedgerLook look(const std::string& operation, bool locked) override;
  void record_start(const RunEntry& entry) override;
  bool record_end(const RunEntry& entry) override;
  void end_claim() override { guard_.reset(); }
  bool shared_by_nested_runs() const override { return true; }
  std::string name() const override;

private:
  const LockDir& dir_;
  std::string shown_;  // DIR as given
  const Logger& log_;
  OwnCopies own_;  // this run's own ledger writes (ledger.hpp)
  UniqueFd guard_;  // guard_ledger(), from a locked look to the record of the start
};

class LocalLock final : public Lock {
public:
  // `dir` stays open for the whole run (the lock may look it up again when
  // it is replaced while waiting).
  LocalLock(const LockRequest& request, Pid pid, const Logger& log, LockDir& dir, LockTarget target);

  Acquisition acquire(const WaitPlan& plan, Instant start) override;
  Blocker blocker() const override;
  void prepare(CommandSpec& spec) override;
  void export_to(CommandSpec& spec) override;
  void release(Ending& ending) override;
  void abandon() override;
  Ledger* ledger() override { return request_.once_per ? &ledger_ : nullptr; }
  std::optional<long long> absorbed_start_ms() override { return absorbed_start_ms_; }

private:
  // -p coalesce: one attempt, then the operation's seat (records/coalesce.hpp)
  // or the skip.
  AcquireResult acquire_coalescing(const WaitPlan& plan, Instant start, LockMode mode, AcquireObserver& reporter);
  // The lock under `plan`: DIR/.state.lock alone, or (--holders) an index
  // first, then .state.lock shared (records/holders.hpp).
  AcquireResult take(const WaitPlan& plan, Instant start, LockMode mode, AcquireObserver& reporter);
  AcquireResult take_in_seat(const WaitPlan& plan, Instant start, LockMode mode, AcquireObserver& reporter);
  AcquireResult take_as_holder(const WaitPlan& plan, Instant start, AcquireObserver& reporter);
  Blocker lock_blocker() const;      // DIR/.state.lock's holder
  // --holders: each held index's holder; `files[i]` is index `indexes[i]`.
  Blocker indexes_blocker(const std::vector<LockFile>& files, const std::vector<int>& indexes) const;
  // The file the holder record goes into: the lock file's, or the index's.
  int holder_record_fd() const;
  HolderRecord this_run(const std::string& pid_start) const;
  std::optional<HoldFacts> hold_facts() const;
  void write_record();
  // Says lock_leaked when a process the job started still holds the lock: true then.
  bool report_leaks(const JobEnd& job) const;

  const LockRequest& request_;
  Pid pid_;
  const Logger& log_;
  LockDir& dir_;
  LockTarget target_;
  std::string shown_;                                 // DIR/.state.lock as given, for messages
  LockFile file_;                                     // acquired: the locked file; else the one found held
  std::vector<sys::KernelLock> holders_at_start_;  // who held it when the wait began
  bool said_waiting_ = false;                         // -v's "waiting" line, once a run
  std::string pid_start_;
  std::optional<HolderRecord> record_;
  LocalLedger ledger_;
  std::optional<HolderRecord> seat_waiter_;  // Coalesced: the run in the seat, when known
  bool watching_seat_ = false;  // take_in_seat(): an index wait looks for a held-back signal
  int seat_signal_ = 0;                      // TimedOut in the seat by this signal (Blocker::ended_by_signal)
  std::optional<int> absorbed_;              // -p coalesce, sat in the seat: how many runs it absorbed
  std::optional<long long> absorbed_start_ms_;  // ... and the newest start among them
  // --holders: the index taken (-1: none), its file (locked); or, when all
  // were held, the index files found held (open, not locked).
  int index_ = -1;
  LockFile index_file_;
  std::vector<LockFile> indexes_held_;
};

// Inside a looplock that already holds this lock (nesting.hpp): nothing to
// take; the command runs in the outer critical section. With -o the command
// still gets no lock descriptor.
class InheritedLock final : public Lock {
public:
  InheritedLock(const LockRequest& request, const Logger& log, const LockDir& dir, const OuterHolder& outer,
                const sys::FileStatus& lock_file, const LockTarget& target, Pid self);

  Acquisition acquire(const WaitPlan& plan, Instant start) override;
  Blocker blocker() const override { return {}; }
  void export_to(CommandSpec& spec) override;
  void release(Ending& /*ending*/) override {}
  // Under the outer holder's lock, the local ledger, for an operation of its
  // own; the outer's own operation is the outer's slot, which this run is
  // part of: it records nothing.
  Ledger* ledger() override { return request_.once_per && !outer_operation_ ? &ledger_ : nullptr; }

private:
  const LockRequest& request_;
  const Logger& log_;
  const LockDir& dir_;
  bool outer_operation_ = false;  // the outer holder's record names this run's operation
  OuterHolder outer_;
  sys::FileStatus lock_file_;
  LockTarget target_;  // a hold's later step exports it
  Pid self_;           // this looplock
  LocalLedger ledger_;
};

// The hold across steps that $LOOPLOCK_HOLD names, when it holds this very
// lock now (records/hold.hpp's check): this run then runs inside it. A
// value for this lock that does not pass is a warning, and the run waits as
// any run does. `etcd_key`: the hold's cluster key, if any.
std::optional<OuterHolder> hold_holder(const EnvList& env, const LockDir& dir, const LockTarget& target,
                                       const Logger& log, sys::FileStatus& lock_file, std::string& etcd_key);

// The holder of this lock when this run is nested in a looplock that holds
// it already (nesting.hpp's rules), or nullopt.
std::optional<OuterHolder> outer_holder(const LockRequest& request, const EnvList& env, const LockDir& dir, Pid self,
                                        sys::FileStatus& lock_file);

}  // namespace looplock
