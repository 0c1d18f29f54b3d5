// The cluster lock on etcd as a kind of lock (lock/lock_kind.hpp): what
// looplock-etcd gives main_program(), over its HTTP transport. The run's lock
// (etcd_lock.hpp), the check of a nested run's outer looplock, and
// --inspect's "cluster" part.
#pragma once

#include "cluster/etcd.hpp"
#include "lock/lock_kind.hpp"
#include "os/ids.hpp"

namespace looplock {

class EtcdKind final : public LockKind {
public:
  explicit EtcdKind(etcd::Transport& transport) : transport_(transport) {}

  std::string key() const override { return "cluster"; }
  std::unique_ptr<Lock> make(const Options& o, const LockRequest& request, const LockTarget& target, Pid pid,
                             const Logger& log, const Reporter& reporter) override;
  void confirm_outer(const Options& o, const LockTarget& target, const EnvList& env, long long outer_pid,
                     const Logger& log) override;
  std::unique_ptr<Lock> join_hold(const Options& o, const LockRequest& request, const LockTarget& target, Pid pid,
                                  const Logger& log, const Reporter& reporter, const EnvList& exports,
                                  Pid holder) override;
  InspectPart inspect(const Options& o, const std::string& canonical_dir, const Logger& log) override;

private:
  etcd::Client client(const Options& o, const Logger& log);

  etcd::Transport& transport_;
};

}  // namespace looplock
