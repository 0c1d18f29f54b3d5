// The cluster lock (--etcd): an etcd lease, the etcd lock service's key under
// it, and a holder value beside it, taken before the local lock and released
// after it. The lease is kept alive from run_command's signal loop (tick);
// when it is lost, the command is terminated and looplock exits 76.
//
// Guarantees rest on the lease: etcd deletes the lock key when the lease
// expires (TTL seconds after the last keepalive etcd received), and looplock
// counts the TTL from the moment it SENT its last successful keepalive, so it
// declares the lease lost no later than etcd expires it, provided the two
// clocks run at about the same rate (no assumption on wall-clock agreement).
// A command that cannot be stopped in time (a stalled process, a paused VM)
// may still act after the lease is gone: the fencing token
// (LOOPLOCK_FENCING_TOKEN, the lock key's create revision, which only grows)
// lets the resource it writes to refuse a stale holder.
#pragma once

#include <optional>
#include <string>

#include "etcd.hpp"
#include "log.hpp"
#include "policy.hpp"

namespace looplock {

// What looplock writes under looplock/NAME/holder (JSON).
struct ClusterHolder {
  std::string host;
  long long pid = 0;
  std::string agent_id;
  std::string operation;
  std::string acquired_at;
  std::string lease;  // hex, as etcdctl prints it
  long long fencing_token = 0;
};
std::string encode_cluster_holder(const ClusterHolder& h);
// The holder JSON as read (any object), or nullopt when not an object.
std::optional<Json> parse_cluster_holder(std::string_view value);
// "host h1 pid 12 (agent a, operation o, since T)", or "an unknown holder".
std::string describe_cluster_holder(const std::optional<Json>& holder);

class ClusterLock {
public:
  enum class Outcome { Acquired, Busy, TimedOut };

  ClusterLock(etcd::Transport& transport, std::vector<etcd::Endpoint> endpoints, std::string name, int ttl_s,
              const Logger& log);
  ~ClusterLock();  // release(), if still held
  ClusterLock(const ClusterLock&) = delete;
  ClusterLock& operator=(const ClusterLock&) = delete;

  // Grants the lease and waits for the lock under `plan`, the deadline
  // counting from `start_ns`. Throws Fatal 69 when etcd cannot be reached or
  // answers with an error.
  Outcome acquire(const WaitPlan& plan, long long start_ns);
  // After acquiring: records the holder (best effort: a warning on failure).
  void write_holder(ClusterHolder h);
  // The holder value as it is now (for skip, timeout and -v lines).
  std::optional<Json> read_holder(long long deadline_ns);

  // One keepalive round, for run_command's tick: false once the lease is
  // lost (etcd says it is gone, or no keepalive was answered for the TTL).
  // `why` is then set.
  bool keep_alive();
  long long tick_interval_ns() const;

  // Unlock and revoke the lease (bounded; best effort).
  void release();

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  long long lease() const { return lease_; }
  long long fencing_token() const { return token_; }
  int ttl_s() const { return ttl_s_; }
  bool lost() const { return lost_; }
  const std::string& lost_why() const { return why_; }
  long long since_last_keepalive_ns() const;
  // Set when acquire() ended Busy or TimedOut: who held the lock.
  const std::optional<Json>& blocker() const { return blocker_; }
  const std::string& endpoint() const { return client_.current_endpoint(); }

private:
  [[noreturn]] void unavailable(const std::string& what, const etcd::Result<bool>& r) const;

  etcd::Client client_;
  std::string name_;
  int ttl_s_;
  const Logger& log_;
  long long lease_ = 0;
  std::string key_;
  long long token_ = 0;
  long long last_ok_ns_ = 0;
  bool lost_ = false;
  std::string why_;
  std::optional<Json> blocker_;
};

}  // namespace looplock
