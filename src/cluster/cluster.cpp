#include "cluster/cluster.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <exception>

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "os/file_status.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "os/unique_fd.hpp"
#include "records/holder.hpp"
#include "records/verdict.hpp"
#include "settings/settings.hpp"

namespace looplock {

namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The least time given to reaching etcd and queuing (-w 0: "one attempt").
constexpr Duration kMinAttempt = milliseconds(250);
// How long single_flight and blocking runs try to reach etcd at all before
// giving up with 69 (a blocking wait that has reached etcd then rides out
// any outage).
constexpr Duration kReach = seconds(5);
constexpr Duration kRelease = seconds(2);
constexpr Duration kLostRelease = seconds(1);
// How long the look at who holds the lock, for a skip's report, may take.
constexpr Duration kLookAtHolder = seconds(1);
// Once a wait's deadline has passed: how long the look at the holder (for
// the report) and the revoke of the waiter's lease may take each, so that
// the deadline (-w) is kept within a few hundred milliseconds. Where etcd
// has stopped answering, the look is not made (the holder the wait found is
// reported) and the revoke is one brief try: the lease expires anyway.
constexpr Duration kAfterDeadline = milliseconds(100);
// After a renewal round that got no answer, the next one is due this soon.
constexpr Duration kRenewRetry = milliseconds(25);
// How early a waiter renews (more than etcd.cpp's slack for ending a watch).
constexpr Duration kRenewEarly = milliseconds(250);
// A password file is a line, not a document.
constexpr size_t kMaxPasswordFile = 4096;

}  // namespace

std::string cluster_lock_name(const std::string& lock_name_option, const std::string& canonical_dir) {
  if (!lock_name_option.empty()) return lock_name_option;
  const size_t slash = canonical_dir.rfind('/');
  std::string base = slash == std::string::npos ? canonical_dir : canonical_dir.substr(slash + 1);
  if (base.empty()) base = "/";
  if (!valid_lock_name(base)) {
    throw Fatal(exit_code::kUsage,
                "the loop directory's base name " + quote(base) +
                    " cannot name a cluster lock: a lock name is 1 to 255 bytes without control characters",
                "Give one with --lock-name NAME.");
  }
  return base;
}

std::string encode_cluster_holder(const ClusterHolder& h) {
  Json j = Json::object();
  j["host"] = clip_bytes(h.host);
  j["pid"] = h.pid;
  j["agent_id"] = clip_bytes(h.agent_id);
  j["operation"] = clip_bytes(h.operation);
  j["acquired_at"] = h.acquired_at;
  j["lease"] = h.lease;
  if (h.fencing_token != 0) j["fencing_token"] = h.fencing_token;
  if (!h.pid_start.empty()) j["pid_start"] = h.pid_start;
  if (!h.boot_id.empty()) j["boot_id"] = h.boot_id;
  if (!h.pid_ns.empty()) j["pid_ns"] = h.pid_ns;
  if (h.ttl_s > 0) j["ttl"] = h.ttl_s;
  if (!h.policy.empty()) j["policy"] = h.policy;
  if (h.holders > 0) j["holders"] = h.holders;
  if (h.hold) j["hold"] = true;
  return dump_json(j);
}

std::optional<Json> parse_cluster_holder(std::string_view value) {
  auto j = Json::parse(value.begin(), value.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

namespace {

void check_readable(const std::string& option, const std::string& path) {
  const UniqueFd fd = sys::open_for_reading(path);
  if (!fd) {
    throw Fatal(exit_code::kUsage, errno_message("cannot read " + option + " " + quote(path), errno),
                "Give a readable PEM file (or leave the option out).");
  }
}

// The password file: a regular file (never a FIFO or a device that would
// hang or stream), at most 4 KiB, its one line without the newline. Its
// content appears in no message.
std::string read_password_file(const std::string& path, const Logger& log) {
  const std::string what = "cannot read --etcd-password-file " + quote(path);
  const std::string hint = "Give a file that holds the etcd user's password on one line (mode 0600).";
  const UniqueFd fd = sys::open_for_reading(path);
  if (!fd) throw Fatal(exit_code::kUsage, errno_message(what, errno), hint);
  sys::FileStatus st;
  if (!sys::status_of_fd(fd.get(), st)) throw Fatal(exit_code::kUsage, errno_message(what, errno), hint);
  if (!st.regular()) throw Fatal(exit_code::kUsage, what + ": not a regular file", hint);
  if (static_cast<size_t>(st.size) > kMaxPasswordFile) {
    throw Fatal(exit_code::kUsage, what + ": larger than 4 KiB, so not a password", hint);
  }
  auto text = sys::pread_all(fd.get(), kMaxPasswordFile + 1);
  if (!text) throw Fatal(exit_code::kUsage, errno_message(what, errno), hint);
  if (text->ends_with('\n')) text->pop_back();
  if (text->ends_with('\r')) text->pop_back();
  if (text->empty()) throw Fatal(exit_code::kUsage, what + ": it is empty", hint);
  if (text->find('\n') != std::string::npos) throw Fatal(exit_code::kUsage, what + ": more than one line", hint);
  if (st.mode & 0004) {  // others may read it
    log.warn("password_file_readable",
             "--etcd-password-file " + quote(path) + " is readable by every user (chmod 600 it)");
  }
  return std::move(*text);
}

}  // namespace

std::string cause_hint(etcd::Cause cause, std::string_view endpoint) {
  // "HOST:PORT" of "http://HOST:PORT" or "https://HOST:PORT".
  const std::string_view hostport = endpoint.substr(std::min(endpoint.find("//"), endpoint.size() - 2) + 2);
  switch (cause) {
    case etcd::Cause::None: return {};
    case etcd::Cause::SpeaksTls:
      return "The endpoint speaks TLS: use https://" + std::string(hostport) + " (and --etcd-cacert).";
    case etcd::Cause::SpeaksPlainHttp:
      return "Use http://" + std::string(hostport) +
             " for this endpoint (it speaks plain HTTP; --etcd-cacert and the client certificate apply only to TLS).";
    case etcd::Cause::NotTls:
      return "The endpoint does not answer in TLS: check that HOST:PORT is an etcd client URL, and its scheme "
             "(http:// for a member that speaks plain HTTP).";
    case etcd::Cause::TlsRejected:
      return "Check --etcd-cacert (the CA that signed etcd's certificates) and, when etcd asks for client "
             "certificates, --etcd-cert and --etcd-key ($LOOPLOCK_ETCD_CACERT, $LOOPLOCK_ETCD_CLIENT_CERT, "
             "$LOOPLOCK_ETCD_CLIENT_KEY).";
    case etcd::Cause::CommonNameRefused:
      return "With authentication enabled, etcd's HTTP gateway refuses client certificates that have a CommonName: "
             "give --etcd-cert a certificate without one (its names as subjectAltNames only), and log in with "
             "--etcd-user.";
    case etcd::Cause::PermissionDenied:
      return "Give the etcd user (--etcd-user) read and write permission on the key prefix looplock/.";
    case etcd::Cause::BadCredentials:
      return "Check --etcd-user and its password ($LOOPLOCK_ETCD_PASSWORD or --etcd-password-file).";
  }
  return {};
}

ClusterAccess cluster_access(const ClusterSettings& c, const Logger& log) {
  ClusterAccess a;
  a.tls = {c.etcd_cacert, c.etcd_cert, c.etcd_key};
  if (!c.etcd_cacert.empty()) check_readable("--etcd-cacert", c.etcd_cacert);
  if (!c.etcd_cert.empty()) check_readable("--etcd-cert", c.etcd_cert);
  if (!c.etcd_key.empty()) check_readable("--etcd-key", c.etcd_key);
  a.user = c.etcd_user;
  if (!c.etcd_user.empty()) {
    a.password =
        c.etcd_password_file.empty() ? c.etcd_password.value_or("") : read_password_file(c.etcd_password_file, log);
  }
  return a;
}

ClusterLock::ClusterLock(etcd::Transport& transport, std::vector<etcd::Endpoint> endpoints, std::string name, int ttl_s,
                         Duration kill_after, const Logger& log, const ClusterAccess& access, etcd::Clock& clock)
    : clock_(clock),
      client_(transport, std::move(endpoints), clock),
      name_(std::move(name)),
      prefixes_(etcd::contender_prefixes(name_)),
      ttl_s_(ttl_s),
      kill_after_(kill_after),
      log_(log) {
  transport.configure(access.tls);
  if (!access.user.empty()) client_.set_credentials(access.user, access.password);
}

ClusterLock::~ClusterLock() { release(); }

template <typename T>
void ClusterLock::unavailable(const std::string& what, const etcd::Result<T>& r) const {
  const bool down = r.status == etcd::Status::Unavailable || r.status == etcd::Status::Timeout;
  std::string hint = cause_hint(r.cause, r.cause_endpoint);
  if (hint.empty()) {
    hint = down ? "Check that etcd answers at the --etcd endpoints ($LOOPLOCK_ETCD)." : "Check etcd's logs.";
  }
  throw Fatal(exit_code::kClusterUnavailable,
              "etcd " + std::string(down ? "unavailable" : "error") + ": cannot " + what + " for cluster lock " +
                  printable(name_) + ": " + printable(r.error),
              hint + " The command did not run.", down ? "etcd_unreachable" : "etcd_error");
}

Instant ClusterLock::expiry() const { return last_ok_ + ttl_granted_; }
Instant ClusterLock::kill_by() const { return expiry() - lease_timing::margin(ttl_s_); }
Instant ClusterLock::term_by() const { return kill_by() - kill_after_; }

std::string ClusterLock::holder_value(bool with_token) const {
  ClusterHolder h = who_;
  h.lease = etcd::lease_hex(lease_);
  h.ttl_s = ttl_s_;
  h.fencing_token = with_token ? token_ : 0;
  return encode_cluster_holder(h);
}

void ClusterLock::note_unavailable(const std::string& error) {
  last_error_ = error;
  unavailable_now_ = true;
  if (!said_unavailable_) {
    said_unavailable_ = true;
    log_.verbose("etcd_unavailable", "etcd does not answer (" + printable(error) + "); waiting for cluster lock " +
                                         printable(name_) + " until it answers again");
  }
}

void ClusterLock::note_answering() {
  if (!unavailable_now_) return;
  unavailable_now_ = false;
  log_.verbose("etcd_answering", "etcd answers again; still waiting for cluster lock " + printable(name_));
}

bool ClusterLock::grant(Instant deadline, etcd::Result<long long>& r) {
  r = client_.lease_grant(ttl_s_, bounded_by(deadline));
  if (!r.ok()) return false;
  lease_ = lease_id_ = r.value;
  own_leases_.push_back(lease_);
  gone_ = false;  // a new lease (a waiter whose lease expired queues again)
  lost_at_.reset();
  why_.clear();
  last_ok_ = r.sent;
  ttl_granted_ = lease_timing::ttl(ttl_s_);
  renewal_ = lease_timing::waiter_renewal(ttl_s_);  // holding, hold() renews more often
  next_renewal_ = r.sent + renewal_;
  keys_.clear();
  for (const auto& p : prefixes_) keys_.push_back(p + etcd::lease_hex(lease_));
  key_ = keys_.front();
  return true;
}

std::optional<Json> contender_value(etcd::Client& client, const std::string& name, const etcd::KeyValue& kv,
                                    const etcd::Deadline& bound) {
  if (auto h = parse_cluster_holder(kv.value)) return h;
  // No value: an earlier looplock, which used etcd's lock service (its value
  // lies beside the unencoded prefix), or another client of the same keys
  // (etcdctl lock).
  if (!etcd::is_contender_key(etcd::legacy_lock_prefix(name), kv.key)) return std::nullopt;
  auto old = client.range({etcd::holder_key(name)}, bound);
  if (!old.ok() || old.value.kvs.empty()) return std::nullopt;
  return parse_cluster_holder(old.value.kvs.front().value);
}

ClusterQueueRead read_cluster_queue(etcd::Client& client, const std::string& name, const etcd::Deadline& bound) {
  ClusterQueueRead q;
  // An encoded name's contenders are read under the unencoded prefix too
  // (earlier versions, etcdctl lock).
  q.prefixes = etcd::contender_prefixes(name);
  std::vector<etcd::RangeResult> reads;
  for (const auto& p : q.prefixes) {
    auto keys = client.range({.key = p,
                              .prefix = true,
                              .limit = 0,
                              .order = etcd::RangeQuery::Order::FirstCreated,
                              .max_create_revision = 0},
                             bound);
    if (!keys.ok()) {
      q.error = keys.error;
      return q;
    }
    reads.push_back(std::move(keys.value));
  }
  q.contenders = etcd::contenders(q.prefixes, reads);
  if (!q.contenders.empty()) q.holder = contender_value(client, name, q.contenders.front(), bound);
  return q;
}

std::string dead_contender_note(const Json& v) {
  auto text = [&](const char* k) { return v.contains(k) && v[k].is_string() ? v[k].get<std::string>() : ""; };
  const long long pid = v.contains("pid") && v["pid"].is_number_integer() ? v["pid"].get<long long>() : 0;
  if (!sys::proven_dead(text("boot_id"), text("pid_ns"), pid, text("pid_start"))) return {};
  const bool ttl = v.contains("ttl") && v["ttl"].is_number_integer();
  const std::string within = ttl ? std::to_string(v["ttl"].get<int>()) + "s" : std::string("its TTL");
  if (v.value("hold", Json(false)) == Json(true)) {
    return "; its looplock has ended (this host), but it took a --hold: its key stays while any step of the hold "
           "runs (each renews its lease), and goes within " + within + " of the last renewal";
  }
  return "; its looplock is dead (this host): its key goes when its lease expires, within " + within;
}

std::string AbsorbedNote::operation() const {
  return value.is_object() && value.contains("operation") && value["operation"].is_string()
             ? value["operation"].get<std::string>()
             : std::string();
}

bool AbsorbedNote::damaged() const {
  const Json w = waiter();
  return waiter_lease == 0 || operation().empty() || !w.contains("pid") || !w["pid"].is_number_integer();
}

Json AbsorbedNote::waiter() const {
  return value.is_object() && value.contains("waiter") && value["waiter"].is_object() ? value["waiter"] : Json::object();
}

namespace {
// Whether holder value `v` and a note's `waiter` name the same looplock.
bool same_looplock(const Json& v, const Json& waiter) {
  auto text = [](const Json& j, const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : ""; };
  if (!v.is_object() || !waiter.contains("pid") || !waiter["pid"].is_number_integer() || !v.contains("pid") ||
      v["pid"] != waiter["pid"] || text(v, "host") != text(waiter, "host")) {
    return false;
  }
  const std::string a = text(v, "pid_start");
  const std::string b = text(waiter, "pid_start");
  return a.empty() || b.empty() || a == b;
}
}  // namespace

std::vector<AbsorbedNote> sort_absorbed(const std::string& root, const std::vector<etcd::KeyValue>& notes,
                                        const std::vector<etcd::KeyValue>& queue) {
  std::vector<AbsorbedNote> out;
  for (const auto& kv : notes) {
    const auto lease = etcd::absorbed_waiter_lease(root, kv.key);
    AbsorbedNote n{.kv = kv, .waiter_lease = lease.value_or(0), .value = Json::parse(kv.value, nullptr, false),
                   .owner = std::nullopt};
    if (!lease) {
      out.push_back(std::move(n));  // not a note's key: damaged, nobody's
      continue;
    }
    if (n.value.is_discarded()) n.value = nullptr;
    const Json waiter = n.waiter();
    for (size_t i = 0; i < queue.size() && !n.owner; ++i) {
      if (queue[i].lease == *lease) n.owner = i;
    }
    for (size_t i = 0; i < queue.size() && !n.owner && !waiter.empty(); ++i) {
      if (const auto v = parse_cluster_holder(queue[i].value); v && same_looplock(*v, waiter)) n.owner = i;
    }
    out.push_back(std::move(n));
  }
  return out;
}

bool absorbed_covered(const AbsorbedNote& note, const std::optional<RunEntry>& last) {
  if (!last || !note.value.is_object() || !note.value.contains("started_ms") ||
      !note.value["started_ms"].is_number_integer()) {
    return false;
  }
  return run_covers(*last, note.value["started_ms"].get<long long>());
}

std::string confirm_cluster_holder(etcd::Client& client, const std::string& name, const std::string& key,
                                   const std::string& host, long long pid, const etcd::Deadline& bound) {
  const ClusterQueueRead q = read_cluster_queue(client, name, bound);
  if (!q.error.empty()) return "cannot read it: " + q.error;
  if (q.contenders.empty()) return "nobody holds it";
  const std::string who = describe_cluster_holder(q.holder);
  if (q.contenders.front().key != key) return "it is held by " + who + ", not through " + key;
  const bool same = q.holder && q.holder->value("host", std::string()) == host &&
                    (*q.holder)["pid"].is_number_integer() && (*q.holder)["pid"].get<long long>() == pid;
  return same ? std::string() : "it is held through " + key + " by " + who + ", not by this looplock's ancestor";
}

std::optional<Json> ClusterLock::holder_of(const etcd::KeyValue& kv, Instant deadline) {
  auto h = contender_value(client_, name_, kv, bounded_by(deadline));
  if (h && !h->contains("fencing_token") && parse_cluster_holder(kv.value)) (*h)["fencing_token"] = kv.create_revision;
  return h;
}

Acquisition ClusterLock::acquire(const WaitPlan& plan, Instant start, ClusterHolder who) {
  const bool nowait = plan.kind == WaitPlan::Kind::NoWait;
  const Deadline deadline = plan.kind == WaitPlan::Kind::Bounded ? Deadline(later(start, plan.timeout)) : std::nullopt;
  who_ = std::move(who);
  who_.acquired_at = sys::utc_now_iso8601();
  // -p coalesce: what this acquisition absorbed (a wait --once-per extends
  // acquires again).
  absorbed_read_ = absorbed_settled_ = false;
  absorbed_.reset();
  absorbed_newest_ms_.reset();
  taken_ = {};
  const Instant reach_by = deadline ? std::max(*deadline, now() + kMinAttempt) : now() + kReach;

  etcd::Result<long long> granted;
  if (!grant(reach_by, granted)) unavailable("grant a lease", granted);

  if (!nowait) return wait_in_queue(deadline);
  if (who_.holders > 0) return take_at_once_as_holder(reach_by);

  // single_flight: take the lock only if nobody holds or waits for it.
  auto t = client_.txn(etcd::create_if_free_txn_body(keys_, holder_value(false), lease_, prefixes_, ledger_key_),
                       bounded_by(std::max(reach_by, now() + kMinAttempt)));
  if (!t.ok()) unavailable("take the lock", t);
  auto ledger_read = pop_ledger_read(t.value);
  if (t.value.succeeded) {
    token_ = t.value.revision;
    ledger_at_acquisition_ = std::move(ledger_read);
    hold();
    return Acquisition::Acquired;
  }
  const auto others = etcd::contenders(prefixes_, t.value.ranges);
  if (others.empty()) {
    // Only keys of other names deeper under a prefix (an earlier looplock's
    // "NAME/lock/..."): queue, and take the lock only if first.
    auto q = client_.txn(etcd::queue_txn_body(keys_, holder_value(false), lease_, prefixes_, ledger_key_),
                         bounded_by(std::max(reach_by, now() + kMinAttempt)));
    if (!q.ok()) unavailable("take the lock", q);
    auto queued_ledger_read = pop_ledger_read(q.value);
    const size_t skip = q.value.succeeded ? 0 : 1;
    const long long mine = q.value.succeeded ? q.value.revision
                           : !q.value.ranges.empty() && !q.value.ranges[0].kvs.empty()
                               ? q.value.ranges[0].kvs[0].create_revision
                               : 0;
    std::vector<etcd::RangeResult> reads(q.value.ranges.begin() + std::min(skip, q.value.ranges.size()),
                                         q.value.ranges.end());
    const auto queue = etcd::contenders(prefixes_, reads);
    if (mine != 0 && !queue.empty() && queue.front().create_revision == mine) {
      token_ = mine;
      ledger_at_acquisition_ = std::move(queued_ledger_read);
      hold();
      return Acquisition::Acquired;
    }
    if (!queue.empty() && queue.front().create_revision != mine)
      blocker_ = holder_of(queue.front(), now() + kLookAtHolder);
  } else {
    blocker_ = holder_of(others.front(), now() + kLookAtHolder);
  }
  release();
  return Acquisition::Busy;
}

void ClusterLock::hold() {
  renewal_ = lease_timing::holder_renewal(ttl_s_, kill_after_);
  next_renewal_ = std::min(next_renewal_, last_ok_ + renewal_);
}

bool ClusterLock::acquired(long long revision, bool waited) {
  token_ = revision;
  if (waited) acquired_at_ = sys::utc_now_iso8601();
  // Hand the command a full window: a lease older than a holder's renewal
  // interval (a waiter renews less often, or its renewals failed) is renewed
  // before the command starts, so that the holder rides out the outage the
  // man page promises from its first moment. At the default TTL a holder
  // renews as often as a waiter: not on the hand-off's path.
  hold();
  if (now() >= next_renewal_ && !renew(term_by())) return false;
  // The value's acquired_at is rewritten at the job loop's first renewal,
  // off the hand-off's path.
  update_value_ = waited;
  return true;
}

// Where we stand in the queue, as read at `revision`: the lock is ours, or
// `q.before` is set to the contender just before us, or our key is gone.
ClusterLock::Step ClusterLock::place(Queue& q, const std::vector<etcd::KeyValue>& queue, long long revision,
                                     Instant step_end) {
  auto mine = std::find_if(queue.begin(), queue.end(),
                           [&](const etcd::KeyValue& kv) { return kv.create_revision == q.my_rev; });
  if (mine == queue.end()) {
    // Our key is gone: the lease expired during an outage. Renew to find out
    // (etcd says it is gone: queue again).
    next_renewal_ = now();
    q.my_rev = 0;
    q.before.reset();
    return Step::Again;
  }
  std::optional<etcd::KeyValue> blocking;
  if (holds(queue, mine, blocking)) return Step::Ours;
  switch (coalesced(queue, mine, step_end)) {
    case Absorb::Yes: return Step::Coalesced;
    case Absorb::ReadAgain: q.before.reset(); return Step::Again;
    case Absorb::No: break;
  }
  note_holders(queue);
  if (!q.said_waiting) {
    blocker_ = holder_of(queue.front(), step_end);
    q.said_waiting = true;
    log_.verbose("waiting", "waiting for cluster lock " + printable(name_) + " on etcd, held by " +
                                describe_cluster_holder(blocker_));
  }
  q.any_ahead = who_.holders > 0 && !blocking;
  q.before = who_.holders > 0 ? (blocking ? *blocking : *std::prev(mine)) : *std::prev(mine);
  q.watch_from = revision + 1;
  return Step::Next;
}

int contender_holders(const etcd::KeyValue& kv) {
  const auto v = parse_cluster_holder(kv.value);
  const Json n = v ? v->value("holders", Json(0)) : Json(0);
  return n.is_number_integer() && n.get<long long>() > 0 && n.get<long long>() <= kMaxHolders ? n.get<int>() : 0;
}

bool contender_holds(const std::vector<etcd::KeyValue>& queue, size_t i, int holders,
                     std::optional<etcd::KeyValue>* exclusive_ahead) {
  if (i == 0) return true;
  if (holders == 0 || i >= queue.size()) return false;
  std::optional<etcd::KeyValue> nearest;
  for (size_t k = 0; k < i; ++k) {
    if (contender_holders(queue[k]) == 0) nearest = queue[k];  // the nearest exclusive one counts
  }
  if (exclusive_ahead) *exclusive_ahead = nearest;
  return !nearest && i < static_cast<size_t>(holders);
}

void ClusterLock::note_holders(const std::vector<etcd::KeyValue>& queue) {
  if (who_.holders == 0) return;
  holders_.clear();
  for (size_t i = 0; i < queue.size(); ++i) {
    if (!contender_holds(queue, i, contender_holders(queue[i]))) continue;
    Json h = parse_cluster_holder(queue[i].value).value_or(Json::object());
    h["fencing_token"] = queue[i].create_revision;
    holders_.push_back(std::move(h));
  }
}

bool ClusterLock::holds(const std::vector<etcd::KeyValue>& queue, std::vector<etcd::KeyValue>::const_iterator mine,
                        std::optional<etcd::KeyValue>& blocking) const {
  return contender_holds(queue, static_cast<size_t>(mine - queue.begin()), who_.holders, &blocking);
}

// --holders with single_flight: queue, and hold only if the queue lets us
// in at once; else leave it (Busy).
Acquisition ClusterLock::take_at_once_as_holder(Instant reach_by) {
  auto t = client_.txn(etcd::queue_txn_body(keys_, holder_value(false), lease_, prefixes_, ledger_key_),
                       bounded_by(std::max(reach_by, now() + kMinAttempt)));
  if (!t.ok()) unavailable("take the lock", t);
  (void)pop_ledger_read(t.value);
  const etcd::TxnResult& r = t.value;
  const size_t reads_at = r.succeeded ? 0 : 1;
  const long long mine = r.succeeded                                     ? r.revision
                         : !r.ranges.empty() && !r.ranges[0].kvs.empty() ? r.ranges[0].kvs[0].create_revision
                                                                         : 0;
  std::vector<etcd::RangeResult> reads(r.ranges.begin() + static_cast<long>(std::min(reads_at, r.ranges.size())),
                                       r.ranges.end());
  const auto queue = etcd::contenders(prefixes_, reads);
  const auto me =
      std::find_if(queue.begin(), queue.end(), [&](const etcd::KeyValue& kv) { return kv.create_revision == mine; });
  std::optional<etcd::KeyValue> blocking;
  if (mine != 0 && me != queue.end() && holds(queue, me, blocking)) {
    token_ = mine;
    hold();
    return Acquisition::Acquired;
  }
  if (!queue.empty()) blocker_ = holder_of(queue.front(), now() + kLookAtHolder);
  note_holders(queue);
  release();
  return Acquisition::Busy;
}

namespace {
// The keys whose being unchanged proves that contender `w` of `queue` still
// waits (it does now): its own, and the nearest exclusive one ahead of it,
// or (--holders N, none exclusive ahead) the N just ahead of it. Empty when
// that is too many for one transaction (etcd takes 128 operations).
std::vector<std::pair<std::string, long long>> still_waits(const std::vector<etcd::KeyValue>& queue, size_t w) {
  std::vector<std::pair<std::string, long long>> out{{queue[w].key, queue[w].create_revision}};
  std::optional<etcd::KeyValue> exclusive_ahead;
  (void)contender_holds(queue, w, contender_holders(queue[w]), &exclusive_ahead);
  if (contender_holders(queue[w]) == 0 || exclusive_ahead) {
    const etcd::KeyValue& k = contender_holders(queue[w]) == 0 ? queue[w - 1] : *exclusive_ahead;
    out.emplace_back(k.key, k.create_revision);
    return out;
  }
  const size_t n = static_cast<size_t>(contender_holders(queue[w]));
  if (n > 64) return {};
  for (size_t k = w - std::min(w, n); k < w; ++k) out.emplace_back(queue[k].key, queue[k].create_revision);
  return out;
}
}  // namespace

ClusterLock::Absorb ClusterLock::coalesced(const std::vector<etcd::KeyValue>& queue,
                                           std::vector<etcd::KeyValue>::const_iterator mine, Instant step_end) {
  if (who_.policy != "coalesce" || arrival_checked_) return Absorb::No;
  std::vector<std::pair<Json, long long>> dead;  // coalescing contenders of this operation ahead, proven dead here
  const size_t mine_at = static_cast<size_t>(mine - queue.begin());
  for (size_t i = 0; i < mine_at; ++i) {
    const etcd::KeyValue& c = queue[i];
    const auto v = parse_cluster_holder(c.value);
    if (!v || v->value("policy", Json("")) != "coalesce" || v->value("operation", Json("")) != who_.operation) continue;
    // One whose looplock is proven dead on this host runs nothing: its key
    // goes with its lease, and this run waits in its place, for the runs
    // it had absorbed too (their notes outlive it: take_absorbed()).
    if (!dead_contender_note(*v).empty()) {
      if (c.lease != 0) dead.emplace_back(*v, c.lease);
      continue;
    }
    // One that holds the lock (the first, or one of --holders N) runs its
    // command already: it cannot run for a run that comes now.
    if (contender_holds(queue, i, contender_holders(c))) continue;
    if (c.lease == 0) continue;
    const auto guards = still_waits(queue, i);
    if (guards.empty()) continue;
    switch (absorb_into(*v, c, guards, step_end)) {
      case Absorb::No: arrival_checked_ = true; return Absorb::No;
      case Absorb::ReadAgain: return Absorb::ReadAgain;
      case Absorb::Yes: break;
    }
    arrival_checked_ = true;  // only on arrival: a run that waits is never absorbed later
    coalesced_into_ = *v;
    blocker_ = holder_of(queue.front(), step_end);
    return Absorb::Yes;
  }
  arrival_checked_ = true;
  // This run waits: in the place of the dead ones, for their runs too.
  for (const auto& [v, lease] : dead) name_dead_waiter(v, lease, step_end);
  return Absorb::No;
}

// The note says when this run started, by which a --once-per waiter is
// judged, and who absorbed it, for whoever finds it left behind. Written,
// and this run's keys deleted (it leaves the queue), only while the waiter
// still waits (`guards`: one that took the lock meanwhile may have started
// its command before this run started; this run then reads the queue
// again) and no run noted itself under this one (then this one waits, and
// runs for it).
ClusterLock::Absorb ClusterLock::absorb_into(const Json& waiter, const etcd::KeyValue& w,
                                             const std::vector<std::pair<std::string, long long>>& guards,
                                             Instant step_end) {
  auto text = [&](const char* k) {
    return waiter.contains(k) && waiter[k].is_string() ? waiter[k].get<std::string>() : std::string();
  };
  const Json note = {{"acquired_at", who_.acquired_at},
                     {"started_ms", start_wall_ms_},
                     {"operation", who_.operation},
                     {"host", who_.host},
                     {"pid", who_.pid},
                     {"waiter", {{"host", text("host")}, {"pid", waiter.value("pid", Json(0))}, {"pid_start", text("pid_start")}}}};
  const std::string key = etcd::absorbed_prefix(name_, w.lease) + etcd::lease_hex(lease_);
  const auto bound = bounded_by(std::max(step_end, now() + kMinAttempt));
  std::vector<std::string> mine;  // under every lease this run had (one expired before it queued again)
  for (const long long l : own_leases_) mine.push_back(etcd::absorbed_prefix(name_, l));
  if (guards.size() + mine.size() > 100) return Absorb::No;  // more than etcd takes in one transaction: it waits
  auto t = client_.txn(etcd::absorb_txn_body(guards, mine, key, dump_json(note), keys_), bound);
  if (!t.ok()) {
    // Not known to be noted (etcd did not answer): the waiter may not count
    // this run, so it is not absorbed; it waits and runs itself. A note that
    // was written after all goes (best effort).
    (void)client_.txn(etcd::delete_prefixes_txn_body({key}), bound);
    return Absorb::No;
  }
  if (t.value.succeeded) return Absorb::Yes;
  const bool absorbed_some = std::any_of(t.value.ranges.begin(), t.value.ranges.end(),
                                         [](const etcd::RangeResult& r) { return r.count > 0; });
  return absorbed_some ? Absorb::No : Absorb::ReadAgain;
}

// A coalescing waiter found dead on this host, after it absorbed runs:
// said, as the local seat's next taker says it (looplock-schedules(7)).
void ClusterLock::name_dead_waiter(const Json& waiter, long long lease, Instant step_end) {
  auto r = client_.range({.key = etcd::absorbed_prefix(name_, lease), .prefix = true, .limit = 1},
                         bounded_by(std::max(step_end, now() + kMinAttempt)));
  if (!r.ok() || r.value.count == 0) return;
  const long long n = r.value.count;
  named_dead_.emplace_back(lease, n);
  const long long pid = waiter.contains("pid") && waiter["pid"].is_number_integer() ? waiter["pid"].get<long long>() : 0;
  log_.warn("coalesced",
            "pid " + std::to_string(pid) + " died in the queue of cluster lock " + printable(name_) + " as the waiter of " +
                printable(who_.operation) + " (KILLed while it waited) after it absorbed " + std::to_string(n) +
                " later run" + (n == 1 ? "" : "s") + ", which never ran: this run waits in its place and runs for them",
            {{"coalesced", n}, {"dead_waiter", waiter}});
}

namespace {
std::optional<long long> note_started_ms(const Json& note) {
  if (!note.is_object() || !note.contains("started_ms") || !note["started_ms"].is_number_integer()) return std::nullopt;
  return note["started_ms"].get<long long>();
}
}  // namespace

void ClusterLock::take_absorbed() {
  if (who_.policy != "coalesce" || lease_ == 0 || adopted_ || absorbed_read_) return;
  absorbed_read_ = true;
  const Instant by = now() + kLookAtHolder;
  const std::string root = etcd::absorbed_root(name_);
  const std::string runs_key = etcd::runs_key(name_, who_.operation);
  std::vector<std::string> reads{root};
  reads.insert(reads.end(), prefixes_.begin(), prefixes_.end());
  reads.push_back(runs_key);
  auto t = client_.txn(etcd::reads_txn_body(reads), bounded_by(by));
  if (!t.ok() || t.value.ranges.size() != reads.size() || t.value.ranges[0].kvs.empty()) return;
  const std::vector<etcd::RangeResult> queue_reads(t.value.ranges.begin() + 1, t.value.ranges.end() - 1);
  const auto queue = etcd::contenders(prefixes_, queue_reads);
  std::optional<RunEntry> last;
  for (const auto& kv : t.value.ranges.back().kvs) {
    if (kv.key == runs_key) last = parse_run_entry(kv.value);
  }
  taken_ = choose_absorbed(sort_absorbed(root, t.value.ranges[0].kvs, queue), queue, last);
}

// The run does the work of what it absorbed (`runs`: its command starts;
// else its slot's run did it, --once-per): the notes go, its own by
// prefix under every lease it had (none can come under one once it holds),
// those it found left behind by their waiter's prefix (its key is gone, or
// it is proven dead here), each damaged one by its key, in transactions
// etcd takes (at most 128 operations); with the lines that say so.
void ClusterLock::settle_absorbed(bool runs) {
  if (who_.policy != "coalesce" || lease_ == 0 || adopted_ || absorbed_settled_) return;
  absorbed_settled_ = true;
  std::vector<std::string> prefixes;
  for (const long long l : own_leases_) prefixes.push_back(etcd::absorbed_prefix(name_, l));
  for (const auto& [lease, found] : taken_.left) prefixes.push_back(etcd::absorbed_prefix(name_, lease));
  const size_t all = prefixes.size() + taken_.damaged.size();
  for (size_t at = 0; at < all; at += 64) {
    std::vector<std::string> part, keys;
    for (size_t i = at; i < std::min(all, at + 64); ++i) {
      if (i < prefixes.size()) {
        part.push_back(prefixes[i]);
      } else {
        keys.push_back(taken_.damaged[i - prefixes.size()]);
      }
    }
    (void)client_.txn(etcd::delete_prefixes_txn_body(part, keys), bounded_by(now() + kLookAtHolder));
  }
  if (!runs) return;
  if (taken_.own > 0) {
    log_.verbose("coalesced",
                 "this run absorbed " + std::to_string(taken_.own) + " later run" + (taken_.own == 1 ? "" : "s") +
                     " of " + printable(who_.operation) + " while it waited in the queue of cluster lock " +
                     printable(name_) + ": it runs for them",
                 {{"coalesced", taken_.own}});
  }
  for (const auto& [lease, found] : taken_.left) say_left_behind(lease, found);
}

// Which notes this run takes: its own (also under a lease of its that
// expired before it queued again), and those of its operation that a
// waiter left behind (its key gone) or that one proven dead on this host
// holds; the newest start among them that still needs a run.
ClusterLock::Taken ClusterLock::choose_absorbed(const std::vector<AbsorbedNote>& notes,
                                                const std::vector<etcd::KeyValue>& queue,
                                                const std::optional<RunEntry>& last) {
  Taken out;
  const auto me = std::find_if(queue.begin(), queue.end(), [&](const etcd::KeyValue& kv) { return kv.lease == lease_; });
  const std::optional<size_t> mine = me == queue.end() ? std::nullopt : std::optional<size_t>(me - queue.begin());
  auto newest = [&](const AbsorbedNote& n) {
    if (const auto ms = note_started_ms(n.value)) absorbed_newest_ms_ = std::max(absorbed_newest_ms_.value_or(*ms), *ms);
  };
  for (const auto& n : notes) {
    if (n.owner && n.owner == mine) {
      if (n.damaged()) continue;  // under this run's own prefix: goes with it
      ++out.own;
      newest(n);
      continue;
    }
    if (n.owner) {
      // Another contender's: a waiter keeps its own, but for one proven dead here.
      const auto v = parse_cluster_holder(queue[*n.owner].value);
      if (!v || dead_contender_note(*v).empty()) continue;
    }
    if (n.damaged()) {
      out.damaged.push_back(n.kv.key);  // not a looplock note: deleted, nobody named
      continue;
    }
    if (n.operation() != who_.operation) continue;
    auto at = std::find_if(out.left.begin(), out.left.end(), [&](const auto& l) { return l.first == n.waiter_lease; });
    if (at == out.left.end()) at = out.left.insert(out.left.end(), {n.waiter_lease, {}});
    if (absorbed_covered(n, last)) continue;  // taken, but its tick needs no run
    newest(n);
    at->second.push_back(n.waiter());
  }
  return out;
}

// The runs a waiter left behind (it died), found by the run that runs for
// them: said, unless this run said so on arrival.
void ClusterLock::say_left_behind(long long lease, const std::vector<Json>& waiters) {
  const size_t n = waiters.size();
  if (n == 0) return;
  const auto named = std::find_if(named_dead_.begin(), named_dead_.end(), [&](const auto& d) { return d.first == lease; });
  if (named != named_dead_.end() && named->second >= static_cast<long long>(n)) return;
  const Json& waiter = waiters.front();
  const long long pid = waiter.contains("pid") && waiter["pid"].is_number_integer() ? waiter["pid"].get<long long>() : 0;
  const std::string host = waiter.contains("host") && waiter["host"].is_string() ? waiter["host"].get<std::string>() : "";
  log_.warn("coalesced",
            "pid " + std::to_string(pid) + (host.empty() ? "" : " on host " + printable(host)) + ", the waiter of " +
                printable(who_.operation) + " in the queue of cluster lock " + printable(name_) +
                ", left it without running the " + std::to_string(n) + " later run" + (n == 1 ? "" : "s") +
                " it had absorbed (its looplock died: KILLed, or its host was lost; or etcd did not answer when it "
            "ended): this run runs for them",
            {{"coalesced", n}, {"dead_waiter", waiter}});
}

std::optional<long long> ClusterLock::newest_absorbed_start_ms() {
  take_absorbed();
  return absorbed_newest_ms_;
}

// A coalescing waiter whose wait ended (its deadline, a signal), or that
// held the cluster lock but never came to its command: the runs it
// absorbed under each lease it had, counted and their notes deleted, and
// its keys deleted, in one transaction, so that no run notes itself under
// it afterwards (the run says none of them ran).
void ClusterLock::count_absorbed() {
  if (who_.policy != "coalesce" || unavailable_now_ || lease_ == 0) return;  // at most 100 ms more
  std::vector<std::string> prefixes;
  for (const long long l : own_leases_) prefixes.push_back(etcd::absorbed_prefix(name_, l));
  auto r = client_.txn(etcd::take_prefixes_txn_body(prefixes, keys_), {.at = now() + kAfterDeadline});
  absorbed_settled_ = true;
  if (!r.ok()) return;
  long long n = 0;
  for (const auto& range : r.value.ranges) n += range.count;
  absorbed_ = static_cast<int>(n);
}

// Every step of a wait ends by the next renewal: the lease is our place in
// the queue. One that expired meanwhile queues again.
void ClusterLock::renew_in_queue(Queue& q, Instant t0, Deadline deadline) {
  if (!renew(*earliest(deadline, t0 + renewal_))) {
    log_.verbose("lease_expired", "the etcd lease expired while waiting for cluster lock " + printable(name_) +
                                      " (etcd did not answer for too long): queuing again");
    lease_ = 0;
    q.my_rev = 0;
  } else if (renewed_) {
    note_answering();
  } else {
    note_unavailable(last_error_);
  }
}

// Joins the queue: one transaction, once (again only if the lease expired),
// which also reads every contender.
ClusterLock::Step ClusterLock::join(Queue& q, Instant step_end) {
  ledger_at_acquisition_.reset();
  q.before.reset();  // queuing (again): whoever was before us must be read anew
  auto t = client_.txn(etcd::queue_txn_body(keys_, holder_value(false), lease_, prefixes_, ledger_key_),
                       bounded_by(step_end));
  if (!t.ok()) {
    if (t.status == etcd::Status::Failed && t.code == etcd::grpc_code::kNotFound) {  // "requested lease not found": it expired
      lease_ = 0;
      return Step::Again;
    }
    if (t.status == etcd::Status::Failed) unavailable("take the lock", t);
    note_unavailable(t.error);
    return Step::Again;
  }
  note_answering();
  auto ledger_read = pop_ledger_read(t.value);
  const etcd::TxnResult& r = t.value;
  const size_t reads_at = r.succeeded ? 0 : 1;
  if (r.succeeded) {
    q.my_rev = r.revision;
  } else if (!r.ranges.empty() && !r.ranges[0].kvs.empty()) {
    q.my_rev = r.ranges[0].kvs[0].create_revision;  // an attempt that timed out created it after all
  }
  if (q.my_rev == 0 || r.ranges.size() < reads_at + prefixes_.size()) return Step::Again;
  const std::vector<etcd::RangeResult> reads(r.ranges.begin() + static_cast<long>(reads_at), r.ranges.end());
  const Step step = place(q, etcd::contenders(prefixes_, reads), r.revision, step_end);
  // Taken at once: the ledger read in the same transaction is the locked read.
  if (step == Step::Ours) ledger_at_acquisition_ = std::move(ledger_read);
  return step;
}

std::optional<etcd::RangeResult> ClusterLock::pop_ledger_read(etcd::TxnResult& r) const {
  if (ledger_key_.empty() || r.ranges.empty()) return std::nullopt;
  etcd::RangeResult read = std::move(r.ranges.back());
  r.ranges.pop_back();
  return read;
}

void ClusterLock::set_ledger_operation(const std::string& operation) { ledger_key_ = etcd::runs_key(name_, operation); }

namespace {
ClusterLock::LedgerEntry ledger_entry_of(const etcd::RangeResult& read) {
  ClusterLock::LedgerEntry e;
  if (read.kvs.empty()) return e;
  e.mod_revision = read.kvs.front().mod_revision;
  e.entry = parse_run_entry(read.kvs.front().value);
  e.damaged = !e.entry;
  return e;
}
}  // namespace

std::variant<ClusterLock::LedgerEntry, sys::Failure> ClusterLock::peek_ledger(Instant deadline) {
  auto r = client_.range({ledger_key_}, bounded_by(deadline));
  if (!r.ok()) return sys::Failure{.what = r.error};
  return ledger_entry_of(r.value);
}

ClusterLock::LedgerEntry ClusterLock::ledger(Instant deadline) {
  LedgerEntry e;
  if (ledger_at_acquisition_) {
    e = ledger_entry_of(*ledger_at_acquisition_);
  } else {
    auto r = client_.range({ledger_key_}, bounded_by(deadline));
    if (!r.ok()) unavailable("read the run ledger", r);
    e = ledger_entry_of(r.value);
  }
  ledger_mod_ = e.mod_revision;
  return e;
}

std::optional<sys::Failure> ClusterLock::write_ledger(const RunEntry& entry, Instant deadline) {
  auto t = client_.txn(
      etcd::guarded_put_txn_body(keys_.at(0), token_, ledger_key_, ledger_mod_, dump_json(run_entry_to_json(entry))),
      bounded_by(deadline));
  if (!t.ok()) return sys::Failure{.what = t.error};
  if (!t.value.succeeded) return sys::Failure{.what = "etcd refused the write (the lease was lost)"};
  ledger_mod_ = t.value.revision;
  return std::nullopt;
}

// Queued: reads the contenders up to us (by create revision).
ClusterLock::Step ClusterLock::read_queue(Queue& q, Instant step_end) {
  std::vector<etcd::RangeResult> reads;
  long long revision = LLONG_MAX;
  for (const auto& p : prefixes_) {
    auto r = client_.range({.key = p,
                            .prefix = true,
                            .limit = 0,
                            .order = etcd::RangeQuery::Order::FirstCreated,
                            .max_create_revision = q.my_rev},
                           bounded_by(step_end));
    if (!r.ok()) {
      if (r.status == etcd::Status::Failed) unavailable("read the lock", r);
      note_unavailable(r.error);
      return Step::Again;
    }
    revision = std::min(revision, r.value.revision);
    reads.push_back(std::move(r.value));
  }
  note_answering();
  return place(q, etcd::contenders(prefixes_, reads), revision, step_end);
}

// Waits for the deletion of the key before ours (its holder's release, or
// its lease's expiry), at most until the next renewal. etcd ends the watch
// then itself, on the kept connection: a round that brought no news is
// followed, after the renewal, by the same watch from the same revision
// (nothing that happened in between is missed), without reading the queue
// again. The news, a canceled watch (a compacted revision: watching it again
// would be canceled again at once) or a failure read the queue again.
void ClusterLock::watch_before(Queue& q, Instant step_end) {
  const etcd::Deadline until{.at = step_end, .interrupt_on = seat_interrupts_};
  auto w = q.any_ahead ? client_.watch_delete(prefixes_.at(0), q.watch_from, until,
                                              etcd::prefix_range_end(prefixes_.at(0)))
                       : client_.watch_delete(q.before->key, q.watch_from, until);
  // A round that etcd did not end itself: it may have stopped answering.
  silent_ = !w.ok() && w.status == etcd::Status::Timeout;
  if (w.ok() && !w.value) return;  // etcd ended the round at its deadline: the same watch next round
  if (!w.ok() && w.status == etcd::Status::Interrupted) return;  // a signal: the loop looks
  q.before.reset();
  if (!w.ok() && w.status != etcd::Status::Timeout) note_unavailable(w.error);
}

// The deadline passed: who holds the lock now, for the report (briefly;
// not at all when etcd has stopped answering: then the holder the wait
// found stands).
void ClusterLock::note_blocker(long long my_rev) {
  if (unavailable_now_ || silent_) return;
  const Instant by = now() + kAfterDeadline;
  std::vector<etcd::RangeResult> reads;
  for (const auto& p : prefixes_) {
    auto owner = client_.range({.key = p,
                                .prefix = true,
                                .limit = 0,
                                .order = etcd::RangeQuery::Order::FirstCreated,
                                .max_create_revision = 0},
                               {.at = by});
    if (!owner.ok()) return;
    reads.push_back(std::move(owner.value));
  }
  const auto queue = etcd::contenders(prefixes_, reads);
  if (!queue.empty() && queue.front().create_revision != my_rev) {
    if (auto h = holder_of(queue.front(), std::max(by, now() + milliseconds(1)))) blocker_ = std::move(h);
  }
  note_holders(queue);
}

Acquisition ClusterLock::wait_in_queue(Deadline deadline) {
  Queue q;
  // A coalescing waiter (its seat: the runs it absorbs count on it) holds
  // back the signals that would end looplock, so that one ends the wait as
  // its deadline does and the run can say what it absorbed; each etcd call
  // ends early once one is pending (etcd_curl.cpp), within about a second.
  const bool seat = who_.policy == "coalesce" && sys::hold_ending_signals();
  seat_interrupts_ = seat ? &sys::ending_interrupts() : nullptr;
  // An error (etcd refused the queue, ...) lets them through again; one
  // already pending stays held, so that the error is said first (looplock
  // then exits with the error's status).
  struct Unhold {
    bool seat;
    ~Unhold() {
      if (seat && std::uncaught_exceptions() > 0 && sys::pending_ending_signal() == 0) sys::let_ending_signals_through();
    }
  } unhold{seat};
  for (bool first = true;; first = false) {
    const Instant t0 = now();
    if (!first && deadline && t0 >= *deadline) break;
    if (seat && (seat_signal_ = sys::pending_ending_signal()) != 0) break;
    // Renewals come a little early while waiting: etcd ends each watch round
    // a moment before the renewal is due (etcd.hpp), and the renewal follows.
    if (!first && lease_ != 0 && t0 + kRenewEarly >= next_renewal_) {
      renew_in_queue(q, t0, deadline);
      continue;
    }
    Instant step_end = *earliest(lease_ != 0 ? next_renewal_ : t0 + lease_timing::waiter_renewal(ttl_s_), deadline);
    step_end = std::max(step_end, t0 + (first ? kMinAttempt : kRenewRetry));  // -w 0: one attempt
    if (lease_ == 0) {
      etcd::Result<long long> granted;
      if (!grant(step_end, granted)) {
        if (granted.status == etcd::Status::Failed) unavailable("grant a lease", granted);
        note_unavailable(granted.error);
        continue;
      }
    }
    Step step = q.my_rev == 0 ? join(q, step_end) : Step::Next;
    if (step == Step::Next && !q.before) step = read_queue(q, step_end);
    if (step == Step::Ours) {
      if (acquired(q.my_rev, q.said_waiting)) {
        if (seat && (seat_signal_ = sys::pending_ending_signal()) != 0) break;  // as if it came first
        if (seat) sys::let_ending_signals_through();
        return Acquisition::Acquired;
      }
      lease_ = 0;
      q.my_rev = 0;
      continue;
    }
    if (step == Step::Coalesced) {
      if (seat) sys::let_ending_signals_through();
      release(kAfterDeadline);
      return Acquisition::Coalesced;
    }
    if (step == Step::Again || !q.before) continue;
    watch_before(q, step_end);
  }
  note_blocker(q.my_rev);
  count_absorbed();
  release(unavailable_now_ || silent_ ? kAfterDeadline / 2 : kAfterDeadline);
  // A signal held back stays so until the run has said what it absorbed
  // (Run: Blocker::ended_by_signal, then it ends of it).
  if (seat && seat_signal_ == 0) sys::let_ending_signals_through();
  return Acquisition::TimedOut;
}

bool ClusterLock::renew(Instant return_by, const sys::Interrupts* interrupt_on) {
  renewed_ = false;
  if (gone_) return false;
  if (lease_ == 0) return false;
  auto r = client_.lease_keepalive(
      lease_, {.at = return_by, .attempt = lease_timing::attempt(ttl_s_), .grow = false, .interrupt_on = interrupt_on});
  if (r.ok() && r.value > 0) {
    renewed_ = true;
    renewal_failing_ = false;
    last_ok_ = std::max(last_ok_, r.sent);
    ttl_granted_ = std::min<Duration>(lease_timing::ttl(ttl_s_), seconds(r.value));
    next_renewal_ = r.sent + renewal_;
    last_error_.clear();
    if (update_value_ && now() < return_by) {
      // After a wait: the value's acquired_at still says when it queued. Best
      // effort, once, off the hand-off's path.
      update_value_ = false;
      who_.acquired_at = acquired_at_;
      (void)client_.txn(
          etcd::update_txn_body(keys_, holder_value(true), lease_, token_),
          {.at = return_by, .attempt = lease_timing::attempt(ttl_s_), .grow = true, .interrupt_on = interrupt_on});
    }
    return true;
  }
  if (r.ok()) {
    gone_ = true;
    if (!lost_at_) lost_at_ = now();
    if (why_.empty()) why_ = "etcd says the lease is gone (revoked or expired)";
    return false;
  }
  // No answer (or a signal for the caller came first): the deadlines stand;
  // try again soon.
  if (r.status != etcd::Status::Interrupted) {
    last_error_ = r.error;
    renewal_failing_ = true;
  }
  next_renewal_ = now() + kRenewRetry;
  return true;
}

void ClusterLock::declare_lost(std::string why) {
  lost_ = true;
  if (!lost_at_) lost_at_ = now();
  if (why_.empty()) why_ = std::move(why);
}

std::string ClusterLock::overdue_why() const {
  return "no keepalive was answered within the lease's safety window (TTL " +
         format_duration(lease_timing::ttl(ttl_s_)) + ", kill-after " + format_duration(kill_after_) + ", margin " +
         format_duration(lease_timing::margin(ttl_s_)) + "; last answered one sent " +
         format_duration(since_last_keepalive()) + " ago" +
         (last_error_.empty() ? "" : "; last error: " + last_error_) + ")";
}

std::optional<ClusterLock::AdoptFailure> ClusterLock::adopt(long long lease, long long token, const std::string& key,
                                                            Instant by) {
  adopted_ = true;
  auto r = client_.lease_keepalive(lease, {.at = by, .attempt = lease_timing::attempt(ttl_s_), .grow = true});
  if (!r.ok()) return AdoptFailure{.why = r.error, .gone = false};
  if (r.value <= 0) return AdoptFailure{.why = "etcd says the hold's lease is gone (revoked or expired)", .gone = true};
  lease_ = lease_id_ = lease;
  token_ = token;
  key_ = key;
  ttl_s_ = static_cast<int>(r.value);  // the hold's --ttl, whatever this run's
  ttl_granted_ = lease_timing::ttl(ttl_s_);
  // Its kill-after fits that TTL, as the holder's does.
  kill_after_ = std::min(kill_after_, lease_timing::default_kill_after(ttl_s_));
  last_ok_ = r.sent;
  next_renewal_ = r.sent + lease_timing::waiter_renewal(ttl_s_);
  hold();
  return std::nullopt;
}

void ClusterLock::release(std::optional<Duration> bound_given) {
  if (lease_ == 0) return;
  if (adopted_) {  // the hold's own: it lets go, or the lease expires once no step renews it
    lease_ = 0;
    return;
  }
  if (who_.policy == "coalesce" && token_ != 0 && !absorbed_settled_) {
    // It held the cluster lock but never came to its command (the local
    // lock, an error): the runs it absorbed did not run either.
    count_absorbed();
    if (absorbed_.value_or(0) > 0) {
      log_.warn("coalesced",
                "the " + std::to_string(*absorbed_) + " later run" + (*absorbed_ == 1 ? "" : "s") + " of " +
                    printable(who_.operation) + " this run absorbed in the queue of cluster lock " + printable(name_) +
                    " never ran: this run ended before its command",
                {{"coalesced", *absorbed_}});
    }
  }
  // Revoking the lease deletes the lock key (the next holder's watch fires
  // at once) and anything else attached to it.
  // Bounded shorter when it matters less: the lease is lost, or no lock was taken.
  // Where etcd has stopped answering (the renewals fail), one brief try:
  // the lease expires anyway, and looplock should not linger for it.
  const Duration usual = lost() || token_ == 0 ? kLostRelease : kRelease;
  const Duration bound = bound_given && *bound_given > Duration::zero() ? *bound_given
                         : renewal_failing_ || unavailable_now_         ? kAfterDeadline
                                                                        : usual;
  (void)client_.lease_revoke(lease_, {.at = now() + bound, .attempt = std::min(bound, lease_timing::attempt(ttl_s_))});
  lease_ = 0;
}

}  // namespace looplock
