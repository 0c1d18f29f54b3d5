#include "cluster/etcd_lock.hpp"

#include "base/duration.hpp"
#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "cluster/etcd.hpp"
#include "job/job.hpp"
#include "os/ids.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "records/verdict.hpp"

namespace looplock {

namespace {
constexpr Duration kLedgerTime = std::chrono::seconds(5);  // a read or write of the run ledger, holding the lock
constexpr Duration kPeekTime = std::chrono::seconds(1);    // a look at it without the lock
}  // namespace

EtcdLock::EtcdLock(const LockRequest& request, const ClusterSettings& cluster, Pid pid, const Logger& log,
                   const Reporter& reporter, etcd::Transport& transport, const LockTarget& target)
    : request_(request),
      cluster_(cluster),
      pid_(pid),
      log_(log),
      reporter_(reporter),
      host_(sys::host_name()),
      lock_(transport, cluster.endpoints, cluster_lock_name(cluster.lock_name, target.canonical_dir), cluster.ttl_s,
            cluster.lease_kill_after, log, cluster_access(cluster, log)) {
  if (request_.once_per) lock_.set_ledger_operation(request_.identity.operation);
  lock_.set_start_wall_ms(request_.start_wall_ms);
}

Acquisition EtcdLock::acquire(const WaitPlan& plan, Instant start) {
  if (hold_) {
    const Instant by = MonotonicClock::now() + std::chrono::seconds(5);
    if (const auto f = lock_.adopt(hold_->lease, hold_->token, hold_->key, by)) {
      throw Fatal(f->gone ? exit_code::kLeaseLost : exit_code::kClusterUnavailable,
                  "cannot renew the etcd lease of the hold (looplock pid " + std::to_string(hold_->holder) +
                      ") that holds cluster lock " + printable(lock_.name()) + ": " + f->why,
                  f->gone ? "The hold has ended; take the lock again (looplock --hold), or run without "
                            "$LOOPLOCK_HOLD. The command did not run."
                          : "Check that etcd answers at the --etcd endpoints ($LOOPLOCK_ETCD). The command did not run.",
                  f->gone ? "lease_lost" : "etcd_unavailable");
    }
    log_.verbose("acquired", "renewing the hold's etcd lease of cluster lock " + printable(lock_.name()) +
                                 " while the command runs (TTL " + std::to_string(lock_.ttl_s()) + " s)",
                 {{"lock_name", lock_.name()}, {"fencing_token", lock_.fencing_token()}});
    return Acquisition::Acquired;
  }
  // Who holds it, for every contender's eyes: with what tells this
  // looplock apart on its host (a waiter on it can prove it dead).
  ClusterHolder who;
  who.host = host_;
  who.pid = pid_;
  who.agent_id = request_.identity.agent;
  who.operation = request_.identity.operation;
  who.pid_start = sys::own_start().value_or("");
  who.boot_id = sys::boot_id();
  who.pid_ns = sys::pid_namespace();
  if (request_.policy == Policy::Coalesce) who.policy = std::string(policy_name(request_.policy));
  who.holders = request_.flags.holders;
  who.hold = request_.hold.has_value();
  const Acquisition got = lock_.acquire(plan, start, who);
  if (got != Acquisition::Acquired) return got;
  const Duration waited = MonotonicClock::now() - start;
  log_.verbose("acquired",
               "cluster lock " + printable(lock_.name()) + " acquired on etcd after " + format_duration(waited) +
                   " (fencing token " + std::to_string(lock_.fencing_token()) + ")",
               {{"lock_name", lock_.name()}, {"fencing_token", lock_.fencing_token()}, {"waited_ms", ms_of(waited)}});
  return Acquisition::Acquired;
}

Blocker EtcdLock::blocker() const {
  Blocker b;
  const ClusterVerdict v = judge_cluster(lock_.blocker(), host_);
  b.what = "cluster lock " + printable(lock_.name()) + " (etcd)";
  b.who = v.holder + (lock_.blocker() ? dead_contender_note(*lock_.blocker()) : std::string());
  b.confirm = v.confirm;
  b.inspect_hint = "looplock --inspect --etcd " + shell_word(cluster_.etcd) +
                   (cluster_.lock_name.empty() ? "" : " --lock-name " + shell_word(cluster_.lock_name)) + " " +
                   shell_word(request_.dir);
  b.fields["cluster"] = Json{{"lock_name", lock_.name()},
                             {"endpoint", lock_.endpoint()},
                             {"holder", lock_.blocker() ? *lock_.blocker() : Json(nullptr)}};
  // --holders: every contender that held it, the first one's included.
  if (request_.flags.holders > 0) {
    b.frees_when = "a place among the " + std::to_string(request_.flags.holders) + " holders of cluster lock " +
                   printable(lock_.name()) + " (etcd) is free";
  }
  if (const auto& all = lock_.holders(); request_.flags.holders > 0 && !all.empty()) {
    b.fields["cluster"]["holders"] = all;
    if (all.size() > 1) {
      b.who += " and " + std::to_string(all.size() - 1) + " more holding it beside that one (--holders " +
               std::to_string(request_.flags.holders) + ")";
    }
  }
  if (const auto& h = lock_.blocker(); h && h->contains("pid") && (*h)["pid"].is_number_integer()) {
    auto text = [&](const char* k) { return h->contains(k) && (*h)[k].is_string() ? (*h)[k].get<std::string>() : ""; };
    b.holder_ids.push_back({.host = text("host"),
                            .pid = (*h)["pid"].get<long long>(),
                            .pid_start = text("pid_start"),
                            .lease_ttl_s = h->contains("ttl") && (*h)["ttl"].is_number_integer() ? (*h)["ttl"].get<int>()
                                                                                                  : 0});
  }
  if (const auto& w = lock_.coalesced_into()) {
    b.waiting = describe_cluster_waiter(w);
    b.fields["coalesce"] = Json{{"waiter", *w}};
  }
  if (const auto n = lock_.absorbed()) b.fields["coalesced"] = *n;
  b.ended_by_signal = lock_.seat_signal();
  b.action_extra = "; the cluster lock " + lock_.name() + " is held " +
                   (v.on_this_host ? "by another looplock on this host" : "on another host") + ": inspect it with '" +
                   b.inspect_hint + "'" + (v.on_this_host ? "" : " on any host") + ".";
  return b;
}

void EtcdLock::export_to(CommandSpec& spec) {
  if (hold_) return;  // the hold's lock exports its key, lease and token
  env_set(spec.env, {{env_name::kFencingToken, std::to_string(lock_.fencing_token())},
                     {env_name::kEtcdKey, lock_.key()},
                     {env_name::kEtcdLease, etcd::lease_hex(lock_.lease())}});
}

void EtcdLock::release(Ending& ending) {
  const JobEnd& job = ending.job;
  // The job loop ended the job at the lease's TERM deadline: the lease is
  // lost from looplock's point of view even if etcd never said so.
  if (job.lease_lost && !lock_.lost()) lock_.declare_lost(lock_.overdue_why());
  if (job.lease_lost) {
    ending.lost = true;
    reporter_.lease_lost(lease_loss(), job, ending.record);
  }
  // A hold whose sentinel ended while steps still ran inside it (or ended
  // without saying whether any did: KILLed): they hold the lock and renew
  // the lease, which expires once none does. Revoked only when none did.
  const int sentinel = shell_status(job.status);
  // Also when this holder thinks its lease lost (its renewals failed for
  // too long): the steps' renewals may have kept it alive, and revoking it
  // would let another host in at once; if etcd says it is gone, leaving it
  // costs nothing.
  const bool steps_inside = request_.hold && sentinel != 0 && sentinel != 1;
  if (steps_inside) lock_.leave_lease();
  lock_.release();  // after the local lock, as promised
  if (hold_) return;  // the hold's: it lets go of it
  if (steps_inside) {
    log_.verbose("released", "left cluster lock " + printable(lock_.name()) +
                                 " to the hold's steps that still run: its lease lives while they renew it");
    return;
  }
  log_.verbose("released", "released cluster lock " + printable(lock_.name()) + " on etcd");
}

LeaseLoss EtcdLock::lease_loss() const {
  LeaseLoss loss{.lease = "etcd lease",
                 .of = "cluster lock " + printable(lock_.name()),
                 .why = lock_.lost_why(),
                 .ttl = std::chrono::seconds(lock_.ttl_s()),
                 .since_renewal = lock_.since_last_keepalive(),
                 .lost_at = lock_.lost_at(),
                 .check =
                     "Check etcd's health and the network between this host and etcd; make writers check "
                     "LOOPLOCK_FENCING_TOKEN so a stale holder is refused.",
                 .hint = "Another host may hold the lock now. Check etcd (" + lock_.endpoint() + ") and the network."};
  loss.fields["cluster"] = Json{{"lock_name", lock_.name()},
                                {"endpoint", lock_.endpoint()},
                                {"holder", nullptr},
                                {"fencing_token", lock_.fencing_token()},
                                {"lease", etcd::lease_hex(lock_.lease())},
                                {"why", lock_.lost_why()}};
  return loss;
}

LedgerLook EtcdLock::EtcdLedger::look(const std::string& /*operation*/, bool locked) {
  if (locked) {
    const auto e = c_.ledger(MonotonicClock::now() + kLedgerTime);
    return {.entry = e.entry, .damaged = e.damaged};
  }
  const auto peeked = c_.peek_ledger(MonotonicClock::now() + kPeekTime);
  const auto* e = std::get_if<ClusterLock::LedgerEntry>(&peeked);
  if (!e) return {.entry = std::nullopt, .damaged = false, .answered = false};
  return {.entry = e->entry, .damaged = e->damaged};
}

void EtcdLock::EtcdLedger::record_start(const RunEntry& entry) {
  RunEntry e = entry;
  e.fencing_token = c_.fencing_token();
  const auto f = c_.write_ledger(e, MonotonicClock::now() + kLedgerTime);
  if (!f) return;
  throw Fatal(exit_code::kClusterUnavailable,
              "cannot record this run's start in the run ledger of cluster lock " + printable(c_.name()) +
                  " on etcd: " + f->what,
              "The command did not run; the next tick tries again.");
}

bool EtcdLock::EtcdLedger::record_end(const RunEntry& entry) {
  RunEntry e = entry;
  e.fencing_token = c_.fencing_token();
  const auto f = c_.write_ledger(e, MonotonicClock::now() + kLedgerTime);
  if (!f) return true;
  log_.warn("ledger_write_failed", "cannot record this run's end in the run ledger of cluster lock " +
                                       printable(c_.name()) + " on etcd: " + f->what +
                                       "; this run does not count, so its slot may run again");
  return false;
}

std::string EtcdLock::EtcdLedger::name() const {
  return "run ledger of cluster lock " + printable(c_.name()) + " on etcd";
}

}  // namespace looplock
