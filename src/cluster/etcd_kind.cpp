#include "cluster/etcd_kind.hpp"

#include <algorithm>
#include <cstdlib>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "cluster/cluster.hpp"
#include "cluster/etcd_lock.hpp"
#include "os/ids.hpp"
#include "os/sys.hpp"
#include "records/hold.hpp"
#include "records/run_entry.hpp"
#include "records/verdict.hpp"
#include "settings/lease_timing.hpp"

namespace looplock {

namespace {
// How long a look at etcd may take: a nested run's check of its outer
// run's cluster lock, and --inspect's reading of the queue.
constexpr Duration kEtcdLook = std::chrono::seconds(5);
}  // namespace

std::unique_ptr<Lock> EtcdKind::make(const Options& o, const LockRequest& request, const LockTarget& target, Pid pid,
                                     const Logger& log, const Reporter& reporter) {
  return std::make_unique<EtcdLock>(request, o.cluster, pid, log, reporter, transport_, target);
}

std::unique_ptr<Lock> EtcdKind::join_hold(const Options& o, const LockRequest& request, const LockTarget& target, Pid pid,
                                          const Logger& log, const Reporter& reporter, const EnvList& exports,
                                          Pid holder) {
  const auto lease = etcd::parse_lease_hex(env_get(exports, env_name::kEtcdLease).value_or(""));
  const auto token = env_get(exports, env_name::kFencingToken);
  const auto key = env_get(exports, env_name::kEtcdKey);
  const std::string name = cluster_lock_name(o.cluster.lock_name, target.canonical_dir);
  const auto prefixes = etcd::contender_prefixes(name);
  if (key && std::none_of(prefixes.begin(), prefixes.end(),
                          [&](const std::string& p) { return etcd::is_contender_key(p, *key); })) {
    throw Fatal(exit_code::kUsage,
                "this step runs inside a hold (looplock pid " + std::to_string(holder) + ") of another cluster lock (key " +
                    printable(*key) + ") than the one it asks for, " + printable(name),
                "Give the step the --lock-name the hold was taken with. The command did not run.",
                "nested_cluster_lock");
  }
  if (!lease || !token || !key) {
    throw Fatal(exit_code::kUsage,
                "this step asks for cluster lock " + printable(name) + ", but the hold it runs inside (looplock pid " +
                    std::to_string(holder) + ") " +
                    (key ? "handed it no etcd lease to renew (an earlier looplock took it?)"
                         : "holds no cluster lock (it was taken without --etcd)"),
                "Take the hold with --etcd too, or run the step without it. The command did not run.",
                "nested_cluster_lock");
  }
  auto lock = std::make_unique<EtcdLock>(request, o.cluster, pid, log, reporter, transport_, target);
  lock->adopt_hold({.lease = *lease, .token = std::atoll(token->c_str()), .key = *key, .holder = holder});
  return lock;
}

// A client of the cluster under the run's TLS files and credentials.
etcd::Client EtcdKind::client(const Options& o, const Logger& log) {
  const ClusterAccess access = cluster_access(o.cluster, log);
  transport_.configure(access.tls);
  etcd::Client c(transport_, o.cluster.endpoints);
  if (!access.user.empty()) c.set_credentials(access.user, access.password);
  return c;
}

// Nested with --etcd: the outer looplock must hold the cluster lock this run
// asks for (its key, LOOPLOCK_ETCD_KEY, is the holder's on etcd, written by
// that looplock on this host). Taking the cluster lock now, inside the local
// one, would take the two in the wrong order: it could wait forever for a
// run that holds the cluster lock and waits for this local one.
void EtcdKind::confirm_outer(const Options& o, const LockTarget& target, const EnvList& env, long long outer_pid,
                             const Logger& log) {
  const std::string name = cluster_lock_name(o.cluster.lock_name, target.canonical_dir);
  const std::optional<std::string> key = env_get(env, env_name::kEtcdKey);
  std::string why = "its environment names no cluster lock (LOOPLOCK_ETCD_KEY)";
  if (key) {
    etcd::Client c = client(o, log);
    why = confirm_cluster_holder(
        c, name, *key, sys::host_name(), outer_pid,
        {.at = MonotonicClock::now() + kEtcdLook, .attempt = lease_timing::attempt(o.cluster.ttl_s)});
    if (why.empty()) return;
    if (why.starts_with("cannot read it")) {
      throw Fatal(exit_code::kClusterUnavailable,
                  "cannot confirm that the outer looplock holds cluster lock " + printable(name) + ": " + why,
                  "The command did not run.");
    }
    // A hold's step, the hold having taken this cluster lock (its key, in
    // LOOPLOCK_HOLD too), which it holds no longer: its lease expired (the
    // holder was stopped, or cut off from etcd), so another run may hold it
    // now. Not a usage error.
    const auto hold = parse_hold_value(env_get(env, env_name::kHold).value_or(""));
    if (hold && hold->pid == outer_pid && hold->etcd_key == *key &&
        (why == "nobody holds it" || why.starts_with("it is held by "))) {
      throw Fatal(exit_code::kLeaseLost,
                  "the hold this step runs inside (looplock pid " + std::to_string(outer_pid) +
                      ") no longer holds cluster lock " + printable(name) + " (" + why +
                      "): its lease expired, so another run may hold the cluster lock now",
                  "The hold ends with 76 (lease_lost) once its holder sees it (--release says so); run the step "
                  "again once it has, outside it or inside a new hold. The command did not run.",
                  "lease_lost");
    }
  }
  throw Fatal(exit_code::kUsage,
              "this looplock runs inside one that holds " + target.loop + "'s lock but not cluster lock " +
                  printable(name) + " (" + why +
                  "): taking it now, inside the local lock, could wait forever for "
                  "a run that holds it and waits for the local one",
              "Give --etcd (and --lock-name " + printable(name) +
                  ") to the outer looplock; a nested run then runs "
                  "inside both. The command did not run.",
              "nested_cluster_lock");
}

namespace {

// The cluster's run ledger (--once-per), one key per operation: under
// "runs" in `c`, and a line each.
void add_cluster_runs(etcd::Client& client, const std::string& name, const etcd::Deadline& bound, Json& c,
                      std::vector<std::string>& lines) {
  auto runs = client.range({.key = etcd::runs_prefix(name), .prefix = true}, bound);
  Json entries = Json::array();
  if (!runs.ok()) {
    c["runs_error"] = runs.error;
    lines.push_back("last run  not read: " + runs.error);
  } else {
    for (const auto& kv : runs.value.kvs) {
      if (auto e = parse_run_entry(kv.value)) {
        lines.push_back("last run  operation " + e->operation + ": " + describe_run(*e));
        entries.push_back(run_entry_to_json(*e));
      } else {
        lines.push_back("last run  a damaged entry, key " + kv.key);
      }
    }
  }
  c["runs"] = std::move(entries);
}

// -p coalesce: the notes of runs absorbed by waiters (etcd::absorbed_root()),
// counted by waiter; a waiter no longer queued left them behind: warnings.
struct AbsorbedNotes {
  std::vector<std::pair<long long, int>> by_waiter;  // a queued waiter's lease, its notes
  std::vector<std::string> warnings;
  std::string error;
  int count(long long lease) const {
    for (const auto& [l, n] : by_waiter) {
      if (l == lease) return n;
    }
    return 0;
  }
};

std::string dead_waiter_warning(const Json& waiter, size_t n, const std::string& name, const std::string& how) {
  const long long pid = waiter.contains("pid") && waiter["pid"].is_number_integer() ? waiter["pid"].get<long long>() : 0;
  const std::string host = waiter.contains("host") && waiter["host"].is_string() ? waiter["host"].get<std::string>() : "";
  const std::string op =
      waiter.contains("operation") && waiter["operation"].is_string() ? waiter["operation"].get<std::string>() : "?";
  return std::to_string(n) + " run" + (n == 1 ? "" : "s") + " of operation " + op + " absorbed by pid " +
         std::to_string(pid) + (host.empty() ? "" : " on host " + host) + ", the coalescing waiter in the queue of "
         "cluster lock " + name + ", never ran: it " + how + " without running them. The next -p coalesce run of " +
         op + " that takes the lock says so and runs for them.";
}

AbsorbedNotes read_absorbed(etcd::Client& client, const std::string& name, const etcd::Deadline& bound) {
  AbsorbedNotes out;
  const std::string root = etcd::absorbed_root(name);
  // The notes, the queue they are judged against and the run ledger (which
  // says which left-behind runs need no run any more), read at one revision.
  const auto prefixes = etcd::contender_prefixes(name);
  std::vector<std::string> reads{root};
  reads.insert(reads.end(), prefixes.begin(), prefixes.end());
  reads.push_back(etcd::runs_prefix(name));
  auto r = client.txn(etcd::reads_txn_body(reads), bound);
  if (!r.ok() || r.value.ranges.size() != reads.size()) {
    out.error = r.ok() ? "an answer without every read" : r.error;
    return out;
  }
  if (r.value.ranges[0].kvs.empty()) return out;
  const auto queue = etcd::contenders(prefixes, {r.value.ranges.begin() + 1, r.value.ranges.end() - 1});
  std::vector<RunEntry> runs;
  for (const auto& kv : r.value.ranges.back().kvs) {
    if (auto e = parse_run_entry(kv.value)) runs.push_back(std::move(*e));
  }
  auto last_run = [&](const std::string& op) -> std::optional<RunEntry> {
    for (const auto& e : runs) {
      if (e.operation == op) return e;
    }
    return std::nullopt;
  };
  const auto notes = sort_absorbed(root, r.value.ranges[0].kvs, queue);
  std::vector<std::pair<long long, std::vector<const AbsorbedNote*>>> left;   // by the lease they were noted under
  std::vector<std::pair<size_t, size_t>> dead_here;                          // a contender proven dead here, its notes
  for (const auto& n : notes) {
    if (n.damaged()) {
      out.warnings.push_back("a damaged note of cluster lock " + name + " (not a looplock note): key " + n.kv.key +
                             "; the next -p coalesce run that takes the lock deletes it (or: etcdctl del " +
                             shell_word(n.kv.key) + ")");
      continue;
    }
    const bool covered = absorbed_covered(n, last_run(n.operation()));
    if (n.owner) {
      const size_t i = *n.owner;
      auto at = std::find_if(out.by_waiter.begin(), out.by_waiter.end(), [&](const auto& w) { return w.first == queue[i].lease; });
      if (at == out.by_waiter.end()) at = out.by_waiter.insert(out.by_waiter.end(), {queue[i].lease, 0});
      ++at->second;
      if (const auto v = parse_cluster_holder(queue[i].value); v && !dead_contender_note(*v).empty() && !covered) {
        auto d = std::find_if(dead_here.begin(), dead_here.end(), [&](const auto& x) { return x.first == i; });
        if (d == dead_here.end()) d = dead_here.insert(dead_here.end(), {i, 0});
        ++d->second;
      }
      continue;
    }
    if (covered) continue;
    auto at = std::find_if(left.begin(), left.end(), [&](const auto& l) { return l.first == n.waiter_lease; });
    if (at == left.end()) at = left.insert(left.end(), {n.waiter_lease, {}});
    at->second.push_back(&n);
  }
  for (const auto& [i, count] : dead_here) {
    out.warnings.push_back(dead_waiter_warning(*parse_cluster_holder(queue[i].value), count, name,
                                               "died in the queue (this host)"));
  }
  for (const auto& [lease, found] : left) {
    // The waiter as its runs' notes name it (an earlier version's notes, which
    // went with its lease, never are left behind).
    Json waiter = found.front()->waiter();
    waiter["operation"] = found.front()->operation();
    out.warnings.push_back(dead_waiter_warning(waiter, found.size(), name,
                                               "left the queue (its looplock died: KILLed, or its host was lost)"));
  }
  return out;
}

}  // namespace

// --inspect --etcd: who holds the cluster lock, who waits, in the order they
// take it, and its run ledger; read only.
InspectPart EtcdKind::inspect(const Options& o, const std::string& canonical_dir, const Logger& log) {
  InspectPart part;
  const std::string name = cluster_lock_name(o.cluster.lock_name, canonical_dir);
  etcd::Client client = this->client(o, log);
  const etcd::Deadline bound{.at = MonotonicClock::now() + kEtcdLook, .attempt = std::chrono::seconds(1)};
  const ClusterQueueRead read = read_cluster_queue(client, name, bound);
  const auto& prefixes = read.prefixes;
  // The key too when the contender is on the unencoded prefix of an encoded
  // name (an earlier looplock, etcdctl lock) or wrote no value; and that it
  // is dead when its value proves it on this host (its key lives on until
  // its lease expires).
  auto key_note = [&](const std::optional<Json>& value, const etcd::KeyValue& kv) {
    std::string note = !value || !etcd::is_contender_key(prefixes.front(), kv.key) ? ", key " + kv.key : "";
    return value ? note + dead_contender_note(*value) : note;
  };
  Json c = {{"lock_name", name}};
  std::vector<std::string> lines;
  if (!read.error.empty()) {
    c["error"] = read.error;
    lines.push_back("cannot read from etcd: " + read.error);
    part.status = exit_code::kClusterUnavailable;
  } else {
    const auto& kvs = read.contenders;
    std::optional<Json> holder = read.holder;
    if (holder) {
      (*holder)["fencing_token"] = kvs.front().create_revision;
      (*holder)["key"] = kvs.front().key;
    }
    const AbsorbedNotes notes = read_absorbed(client, name, bound);
    part.warnings = notes.warnings;
    if (!notes.error.empty()) c["absorbed_error"] = notes.error;
    Json waiting = Json::array();
    Json also = Json::array();  // --holders: the contenders that hold it beside the first
    for (size_t i = 1; i < kvs.size(); ++i) {
      std::optional<Json> value = parse_cluster_holder(kvs[i].value);
      if (contender_holds(kvs, i, contender_holders(kvs[i]))) {
        Json h = value.value_or(Json::object());
        h["fencing_token"] = kvs[i].create_revision;
        h["key"] = kvs[i].key;
        lines.push_back("also held by " + describe_cluster_holder(h) + key_note(value, kvs[i]) + ", fencing token " +
                        std::to_string(kvs[i].create_revision) + " (--holders " +
                        std::to_string(contender_holders(kvs[i])) + ")");
        also.push_back(std::move(h));
        continue;
      }
      Json w = value.value_or(Json::object());
      // A waiter's value says when it queued, not an acquisition.
      if (w.contains("acquired_at")) {
        w["queued_at"] = w["acquired_at"];
        w.erase("acquired_at");
      }
      w["key"] = kvs[i].key;
      const std::optional<Json> shown = value ? std::optional<Json>(w) : std::nullopt;
      std::string absorbed;
      if (const auto n = notes.count(kvs[i].lease)) {
        w["coalesced"] = n;
        absorbed = "; it absorbed " + std::to_string(n) + " later run" + (n == 1 ? "" : "s");
      }
      lines.push_back("waiting " + std::to_string(waiting.size() + 1) + ": " + describe_cluster_waiter(shown) +
                      key_note(value, kvs[i]) + absorbed);
      waiting.push_back(std::move(w));
    }
    c["held"] = !kvs.empty();
    c["contenders"] = kvs.size();
    c["holder"] = holder ? *holder : Json(nullptr);
    c["holders"] = also;
    c["waiting"] = waiting;
    if (kvs.empty()) {
      lines.insert(lines.begin(), "free (lock name " + name + ")");
    } else {
      lines.insert(lines.begin(), "held by " + describe_cluster_holder(holder) + key_note(holder, kvs.front()) +
                                      ", fencing token " + std::to_string(kvs.front().create_revision) +
                                      " (lock name " + name + ")");
      if (waiting.empty()) lines.push_back("waiting none");
    }
  }
  if (read.error.empty()) add_cluster_runs(client, name, bound, c, lines);
  part.json = std::move(c);
  part.lines = std::move(lines);
  return part;
}

}  // namespace looplock
