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
  // The command is to run: it runs for the runs this one absorbed.
  void all_held() override {
    if (!hold_) lock_.take_absorbed();
  }
  void settle_absorbed(bool runs) override {
    if (!hold_) lock_.settle_absorbed(runs);
  }
  Lease* lease() override { return &lease_; }
  void release(Ending& ending) override;
  void abandon() override { lock_.release(); }
  Ledger* ledger() override { return request_.once_per && !hold_ ? &ledger_ : nullptr; }
  std::optional<long long> absorbed_start_ms() override {
    return request_.once_per && !hold_ ? lock_.newest_absorbed_start_ms() : std::nullopt;
  }

  // A hold's later step: instead of taking the lock, acquire() adopts the
  // hold's lease (ClusterLock::adopt()), which the job loop then renews
  // while the command runs; the hold's key, token and lease are exported
  // by the hold's own lock (local_lock.hpp's InheritedLock).
  struct HoldLease {
    long long lease = 0;
    long long token = 0;
    std::string key;
    Pid holder = 0;
  };
  void adopt_hold(HoldLease hold) { hold_ = std::move(hold); }

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

  std::optional<HoldLease> hold_;

  // The lost lease, as the reporter words it.
  LeaseLoss lease_loss() const;

  // The lease as the job loop sees it: its renewals, and the deadlines by
  // which the job must have been sent TERM and KILL.
  class JobLease final : public Lease {
  public:
    explicit JobLease(ClusterLock& c) : c_(c) {}
    Instant next_renewal() const override { return c_.next_renewal(); }
    bool renew(Deadline return_by, const sys::Interrupts& interrupt_on) override {
      return c_.renew(return_by.value_or(c_.term_by()), &interrupt_on);
    }
    Instant term_by() const override { return c_.term_by(); }
    Instant kill_by() const override { return c_.kill_by(); }
    bool renewal_failing() const override { return c_.renewal_failing(); }
    Duration least_renewal() const override { return lease_timing::attempt(c_.ttl_s()); }

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
