// The cluster lock of a run (lock.hpp), on etcd (cluster.hpp): taken before
// the local lock and released after it, its lease renewed by the job loop,
// its fencing token exported to the command.
#pragma once

#include <optional>
#include <string>

#include "base/log.hpp"
#include "cluster/cluster.hpp"
#include "lock/lock.hpp"
#include "lock/report.hpp"
#include "os/ids.hpp"
#include "records/lock_id.hpp"
#include "settings/settings.hpp"

namespace looplock {

class EtcdLock final : public Lock {
public:
  EtcdLock(const LockRequest& request, const ClusterSettings& cluster, Pid pid, const Logger& log,
           const Reporter& reporter, etcd::Transport& transport, const LockTarget& target);

  Acquisition acquire(const WaitPlan& plan, Instant start) override;
  Blocker blocker() const override;
  void export_to(CommandSpec& spec) override;
  Lease* lease() override { return &lease_; }
  void release(Ending& ending) override;
  void abandon() override { lock_.release(); }
  Ledger* ledger() override { return request_.once_per ? &ledger_ : nullptr; }

private:
  // The cluster's run ledger: one key per operation beside the lock's keys
  // (cluster.hpp).
  class EtcdLedger final : public Ledger {
  public:
    EtcdLedger(ClusterLock& c, const Logger& log) : c_(c), log_(log) {}
    LedgerLook look(const std::string& operation, bool locked) override;
    void record_start(const RunEntry& entry) override;
    bool record_end(const RunEntry& entry) override;
    std::string name() const override;

  private:
    ClusterLock& c_;
    const Logger& log_;
  };

  // The lost lease, as the reporter words it.
  LeaseLoss lease_loss() const;

  // The lease as the job loop sees it: its renewals, and the deadlines by
  // which the job must have been sent TERM and KILL.
  class JobLease final : public Lease {
  public:
    explicit JobLease(ClusterLock& c) : c_(c) {}
    // The cluster lock counts nanoseconds of the monotonic clock.
    Instant next_renewal() const override { return instant_ns(c_.next_renewal_ns()); }
    bool renew(Deadline return_by, const sys::Interrupts& interrupt_on) override {
      return c_.renew(return_by ? ns_of(*return_by) : 0, &interrupt_on);
    }
    Instant term_by() const override { return instant_ns(c_.term_by_ns()); }
    Instant kill_by() const override { return instant_ns(c_.kill_by_ns()); }
    bool renewal_failing() const override { return c_.renewal_failing(); }
    Duration least_renewal() const override { return Duration(lease_timing::attempt_ns(c_.ttl_s())); }

  private:
    ClusterLock& c_;
  };

  const LockRequest& request_;
  const ClusterSettings& cluster_;
  Pid pid_;
  const Logger& log_;
  const Reporter& reporter_;
  std::string host_;
  ClusterLock lock_;
  JobLease lease_{lock_};
  EtcdLedger ledger_{lock_, log_};
};

}  // namespace looplock
