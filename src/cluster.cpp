#include "cluster.hpp"

#include <algorithm>

#include "error.hpp"
#include "exit_codes.hpp"
#include "holder.hpp"
#include "sys.hpp"

namespace looplock {

namespace {

constexpr long long kSec = 1'000'000'000LL;
// A request that is not itself a wait (lease grant, range, put): what a
// healthy cluster answers well within.
constexpr long long kRequestNs = 5 * kSec;
// The least time given to one lock attempt (-w 0: "one attempt").
constexpr long long kMinAttemptNs = kSec / 4;
// single_flight: the lock was free a moment ago; how long to let the lock
// request wait before counting it as taken by another host.
constexpr long long kSingleFlightLockNs = kSec / 2;
constexpr long long kReleaseNs = 2 * kSec;

std::string text_field(const Json& j, const char* k) {
  return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("?");
}

}  // namespace

std::string encode_cluster_holder(const ClusterHolder& h) {
  Json j = Json::object();
  j["host"] = clip_bytes(h.host);
  j["pid"] = h.pid;
  j["agent_id"] = clip_bytes(h.agent_id);
  j["operation"] = clip_bytes(h.operation);
  j["acquired_at"] = h.acquired_at;
  j["lease"] = h.lease;
  j["fencing_token"] = h.fencing_token;
  return dump_json(j);
}

std::optional<Json> parse_cluster_holder(std::string_view value) {
  auto j = Json::parse(value.begin(), value.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

std::string describe_cluster_holder(const std::optional<Json>& holder) {
  if (!holder) return "another host (no holder value yet)";
  const Json& h = *holder;
  std::string pid = h.contains("pid") && h["pid"].is_number_integer() ? std::to_string(h["pid"].get<long long>()) : "?";
  return printable("host " + text_field(h, "host") + " pid " + pid + " (agent " + text_field(h, "agent_id") +
                   ", operation " + text_field(h, "operation") + ", since " + text_field(h, "acquired_at") + ")");
}

ClusterLock::ClusterLock(etcd::Transport& transport, std::vector<etcd::Endpoint> endpoints, std::string name,
                         int ttl_s, const Logger& log)
    : client_(transport, std::move(endpoints)), name_(std::move(name)), ttl_s_(ttl_s), log_(log) {}

ClusterLock::~ClusterLock() { release(); }

void ClusterLock::unavailable(const std::string& what, const etcd::Result<bool>& r) const {
  const bool down = r.status == etcd::Status::Unavailable || r.status == etcd::Status::Timeout;
  throw Fatal(exit_code::kClusterUnavailable,
              "etcd " + std::string(down ? "unavailable" : "error") + ": cannot " + what + " for cluster lock " +
                  printable(name_) + ": " + printable(r.error),
              down ? "Check that etcd answers at the --etcd endpoints ($LOOPLOCK_ETCD); the command did not run."
                   : "The command did not run; check etcd's logs.",
              down ? "etcd_unreachable" : "etcd_error");
}

namespace {
template <typename T>
etcd::Result<bool> as_bool(const etcd::Result<T>& r) {
  etcd::Result<bool> b;
  b.status = r.status;
  b.error = r.error;
  return b;
}
}  // namespace

std::optional<Json> ClusterLock::read_holder(long long deadline_ns) {
  auto r = client_.range(etcd::holder_key(name_), false, deadline_ns);
  if (!r.ok() || r.value.empty()) return std::nullopt;
  return parse_cluster_holder(r.value.front().value);
}

ClusterLock::Outcome ClusterLock::acquire(const WaitPlan& plan, long long start_ns) {
  const bool bounded = plan.kind == WaitPlan::Kind::Bounded;
  const bool nowait = plan.kind == WaitPlan::Kind::NoWait;
  const long long deadline = start_ns + plan.deadline_ns;
  auto request_deadline = [&] {
    const long long now = sys::monotonic_ns();
    if (!bounded) return now + kRequestNs;
    return std::max(std::min(deadline, now + kRequestNs), now + kMinAttemptNs);
  };

  const long long grant_sent = sys::monotonic_ns();
  auto grant = client_.lease_grant(ttl_s_, request_deadline());
  if (!grant.ok()) unavailable("grant a lease", as_bool(grant));
  lease_ = grant.value;
  last_ok_ns_ = grant_sent;

  const std::string service = etcd::lock_service_name(name_);
  if (nowait) {
    auto held = client_.range(service + "/", true, request_deadline());
    if (!held.ok()) unavailable("read the lock", as_bool(held));
    if (!held.value.empty()) {
      blocker_ = read_holder(request_deadline());
      return Outcome::Busy;
    }
  } else if (log_.is_verbose()) {
    auto held = client_.range(service + "/", true, request_deadline());
    if (held.ok() && !held.value.empty()) {
      log_.verbose("waiting", "waiting for cluster lock " + printable(name_) + " on etcd, held by " +
                                  describe_cluster_holder(read_holder(request_deadline())));
    }
  }

  const long long ttl_ns = static_cast<long long>(ttl_s_) * kSec;
  for (;;) {
    const long long now = sys::monotonic_ns();
    // Wait in rounds of a third of the TTL, renewing the lease between them:
    // the lock request is the lease's only traffic meanwhile.
    long long until = now + ttl_ns / 3;
    if (bounded) until = std::min(until, std::max(deadline, now + kMinAttemptNs));
    if (nowait) until = now + kSingleFlightLockNs;
    auto locked = client_.lock(service, lease_, until);
    if (locked.ok()) {
      key_ = locked.value;
      break;
    }
    if (locked.status != etcd::Status::Timeout) unavailable("take the lock", as_bool(locked));
    if (nowait || (bounded && sys::monotonic_ns() >= deadline)) {
      blocker_ = read_holder(sys::monotonic_ns() + kSec);
      return nowait ? Outcome::Busy : Outcome::TimedOut;
    }
    const long long sent = sys::monotonic_ns();
    auto alive = client_.lease_keepalive(lease_, sent + ttl_ns / 3);
    if (!alive.ok()) unavailable("renew the lease while waiting", as_bool(alive));
    if (alive.value <= 0) {
      etcd::Result<bool> r;
      r.status = etcd::Status::Failed;
      r.error = "the lease expired or was revoked while looplock waited";
      unavailable("keep the lease", r);
    }
    last_ok_ns_ = sent;
  }

  // The fencing token: the lock key's create revision (etcd's revisions only
  // grow, and each holder's key is created anew under its own lease).
  auto kv = client_.range(key_, false, request_deadline());
  if (!kv.ok()) unavailable("read the lock key", as_bool(kv));
  if (kv.value.empty()) {
    etcd::Result<bool> r;
    r.status = etcd::Status::Failed;
    r.error = "the lock key vanished right after it was acquired (lease expired?)";
    unavailable("hold the lock", r);
  }
  token_ = kv.value.front().create_revision;
  return Outcome::Acquired;
}

void ClusterLock::write_holder(ClusterHolder h) {
  h.lease = etcd::lease_hex(lease_);
  h.fencing_token = token_;
  auto r = client_.put(etcd::holder_key(name_), encode_cluster_holder(h), lease_, sys::monotonic_ns() + kRequestNs);
  if (!r.ok()) {
    log_.warn("cluster_holder_write_failed",
              "cannot write the holder value of cluster lock " + printable(name_) + ": " + printable(r.error));
  }
}

long long ClusterLock::tick_interval_ns() const { return static_cast<long long>(ttl_s_) * kSec / 3; }

long long ClusterLock::since_last_keepalive_ns() const { return sys::monotonic_ns() - last_ok_ns_; }

bool ClusterLock::keep_alive() {
  if (lost_) return false;
  const long long ttl_ns = static_cast<long long>(ttl_s_) * kSec;
  const long long expires = last_ok_ns_ + ttl_ns;
  const long long sent = sys::monotonic_ns();
  if (sent >= expires) {
    lost_ = true;
    why_ = "no keepalive was answered for the lease's TTL (" + std::to_string(ttl_s_) + " s)";
    return false;
  }
  auto r = client_.lease_keepalive(lease_, std::min(expires, sent + tick_interval_ns()));
  if (r.ok() && r.value > 0) {
    last_ok_ns_ = sent;
    return true;
  }
  if (r.ok()) {
    lost_ = true;
    why_ = "etcd says the lease is gone (revoked or expired)";
    return false;
  }
  if (sys::monotonic_ns() >= expires) {
    lost_ = true;
    why_ = "no keepalive was answered for the lease's TTL (" + std::to_string(ttl_s_) + " s; last error: " + r.error + ")";
    return false;
  }
  return true;  // try again at the next tick
}

void ClusterLock::release() {
  if (lease_ == 0) return;
  const long long deadline = sys::monotonic_ns() + (lost_ ? kSec : kReleaseNs);
  if (!key_.empty() && !lost_) (void)client_.unlock(key_, deadline);
  // Revoking the lease deletes whatever is still attached to it (the lock
  // key, the holder value, a waiter's key): the next holder need not wait
  // for the TTL.
  (void)client_.lease_revoke(lease_, deadline);
  lease_ = 0;
  key_.clear();
}

}  // namespace looplock
