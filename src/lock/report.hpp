// What a run says about itself: the skip and timeout lines (with a timeout's
// incident row) for a lock in the way, and the lines and rows about a job
// looplock ended (--max-time, a lost lease). One line builder for every lock:
// each lock only says who is in the way (lock.hpp's Blocker).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "base/log.hpp"
#include "base/policy.hpp"
#include "lock/lock.hpp"
#include "os/ids.hpp"
#include "records/holder.hpp"
#include "records/incident.hpp"
#include "records/run_entry.hpp"
#include "settings/settings.hpp"

namespace looplock {

// A lease that was lost while the job ran, as the lock that held it tells
// it: the reporter words the line and the row from it, whatever the kind.
struct LeaseLoss {
  std::string lease;                // what was lost: "etcd lease"
  std::string of;                   // whose: "cluster lock NAME" (printable)
  std::string why;                  // the cause
  Duration ttl{0};                  // the lease's time to live: the row's deadline_ms
  Duration since_renewal{0};        // since the last answered renewal was sent: the row's waited_ms
  Deadline lost_at;                 // when the loss was known (none: not known)
  std::string check;                // what the operator checks, for the row's operator_action
  std::string hint;                 // the line's hint
  Json fields = Json::object();     // the kind's own fields, each under its key ({"cluster": {...}})
};

class Reporter {
public:
  // What every line and row names: the loop dir as given, who runs what,
  // and the wait's policy; `pid` is looplock's.
  // The names in its lines and rows are clipped as records clip them
  // (kMaxIdentityBytes): a name of any length is allowed.
  Reporter(std::string dir, const Identity& identity, Policy policy, Pid pid, const Logger& log)
      : dir_(std::move(dir)),
        identity_{clip_bytes(identity.agent), clip_bytes(identity.operation)},
        policy_(policy),
        pid_(pid),
        log_(log) {}

  // Once DIR is open: where rows go, and the lock's id.
  void set_target(int dirfd, std::string lock_id) {
    dirfd_ = dirfd;
    lock_id_ = std::move(lock_id);
  }

  // single_flight found the lock held: the noop-locked line.
  void skip(const Blocker& b) const;
  // -p coalesce: a run of this operation already waits for the lock, and
  // absorbed this one (the noop-coalesced line).
  void coalesced(const Blocker& b) const;
  // --once-per: this lock's operation already ran in this slot (the
  // noop-already-run line). `holding`: who holds the lock, when that run
  // (its looplock, or a process of its job) holds it now; named as every
  // other line names a holder, never by the ledger's pid alone (that
  // looplock may have died, its job holding on).
  // `once_per`: this run's --once-per.
  void already_run(const RunEntry& run, Duration once_per, const Blocker* holding, const std::string& ledger) const;
  // The deadline passed: the row, then the lock_acquire_timeout line.
  void timeout(const Blocker& b, const WaitPlan& plan, Duration waited, int exit_status) const;
  // --max-time (`max_time`) ended the job.
  // `leaked`: a process the job started outside its group still holds the lock.
  // `from`: where the limit came from when not --max-time (JobLimits::max_time_from).
  void max_time(const JobEnd& job, Duration max_time, const std::optional<HolderRecord>& record, bool leaked,
                const std::string& from = {}) const;
  // The lease was lost while the job ran, and the job was ended.
  void lease_lost(const LeaseLoss& loss, const JobEnd& job, const std::optional<HolderRecord>& record) const;

private:
  Incident incident(std::string error_code) const;
  void append(const Incident& inc) const;
  Json fields(const Blocker& b) const;

  std::string dir_;
  Identity identity_;
  Policy policy_;
  Pid pid_;
  const Logger& log_;
  int dirfd_ = -1;
  std::string lock_id_;
};

}  // namespace looplock
