// The cluster lock (--etcd): an etcd lease and, under it, one key per
// contender, looplock/NAME/lock/<lease hex>, whose value is the contender's
// holder JSON (NAME percent-encoded when it holds '/' or '%', and then the
// same key under the unencoded prefix too, for earlier versions: see
// etcd.hpp). The contender whose key has the lowest create revision holds
// the lock (etcd's concurrency.Mutex, which etcdctl lock and etcd's lock
// service use: they exclude each other). A waiter creates its key once, in
// one transaction, and keeps it and its lease for the whole wait, so waiters
// take the lock in the order they arrived; it watches the key just before its
// own for deletion. The cluster lock is taken before the local one and
// released after it, by revoking the lease (which deletes the key).
//
// The lease, as the job loop sees it. Its expiry counts, on this host's
// monotonic clock, from the moment the last keepalive (or the grant) that
// etcd answered was SENT: etcd counts from when it received it, so looplock's
// expiry is never later than etcd's, provided the two clocks run at about the
// same rate (no agreement on wall-clock time is needed). The command's job
// must have ended before that expiry: TERM by term_by() (expiry −
// kill-after − margin), KILL by kill_by() (expiry − margin), where the
// margin covers this host's scheduling, cutting a request short, and 1 % of
// the TTL for the clocks' rates. A host that is paused as a whole (a
// suspended VM, SIGSTOP of looplock and its command) can still act after its
// lease is gone: the fencing token (LOOPLOCK_FENCING_TOKEN, the lock key's
// create revision, which only grows) lets the resource refuse it.
//
// The numbers (how often it renews, holding and waiting; each attempt's
// timeout; the margin; the default kill-after; the outage a holder's lease
// rides out) are stated once, in settings/lease_timing.hpp; the man page's
// CLUSTER section has them by TTL, and a unit test reads that table back.
// At the default TTL a holder's lease rides out a 3-member cluster's leader
// election (1-2 s with etcd's default election timeout; etcd extends its
// leases when a new leader takes over).
//
// Connections: one per run, kept (libcurl's cache), and one per wait: a
// waiter's watch is bounded by etcd itself (the gateway's Grpc-Timeout,
// etcd.hpp), so that the renewal and the next watch go on the same
// connection; the news (the key before ours deleted) arrives while the
// watch is open, and ending the watch then closes that connection (HTTP/1.1
// cannot end one request otherwise): the run goes on with a new one.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/log.hpp"
#include "base/policy.hpp"
#include "cluster/etcd.hpp"
#include "os/failure.hpp"
#include "records/run_entry.hpp"
#include "settings/lease_timing.hpp"
#include "settings/settings.hpp"

namespace looplock {

// The cluster lock's name for a loop directory: `lock_name_option`
// (--lock-name) when given, else the base name of `canonical_dir` (DIR's
// canonical path; "/" for the root directory, whose path is empty here).
// Throws Fatal 64 when that base name cannot name a lock (valid_lock_name()).
// A run and --inspect both take the name from here.
std::string cluster_lock_name(const std::string& lock_name_option, const std::string& canonical_dir);

// What looplock writes as the value of its lock key (JSON).
struct ClusterHolder {
  std::string host;
  long long pid = 0;
  std::string agent_id;
  std::string operation;
  std::string acquired_at;
  std::string lease;            // hex, as etcdctl prints it
  long long fencing_token = 0;  // 0: not written (the key's create revision is the token)
  // What tells its looplock apart on its host (ledger.hpp's RunEntry has the
  // same), and its lease's TTL (how long a dead holder's lease can live on);
  // each left out when empty or 0 (earlier versions wrote none).
  std::string pid_start;
  std::string boot_id;
  std::string pid_ns;
  int ttl_s = 0;
  // The run's policy, written when it is coalesce: a later coalescing run
  // of the same operation finds it queued and is absorbed by it.
  std::string policy;
  // --holders N: N, written then only. A contender without it (an earlier
  // looplock, etcdctl lock, a run without --holders) is exclusive.
  int holders = 0;
  // --hold: written then only ("hold": true). Its steps renew its lease, so
  // its key outlives its looplock while one runs.
  bool hold = false;
};
std::string encode_cluster_holder(const ClusterHolder& h);
// The holder JSON as read (any object), or nullopt when not an object.
std::optional<Json> parse_cluster_holder(std::string_view value);

// A contender's holder value: its key's, or (an earlier looplock's key,
// which has none) the value beside the unencoded prefix; nullopt when it
// left none (etcdctl lock).
std::optional<Json> contender_value(etcd::Client& client, const std::string& name, const etcd::KeyValue& kv,
                                    const etcd::Deadline& bound);

// Who holds cluster lock `name` and who waits, in the order they take it
// (read only: --inspect --etcd).
struct ClusterQueueRead {
  std::string error;                       // why it could not be read; empty when it was
  std::vector<std::string> prefixes;       // where contenders are looked for (the first is the name's own)
  std::vector<etcd::KeyValue> contenders;  // the first holds the lock
  std::optional<Json> holder;              // the first's value
};
ClusterQueueRead read_cluster_queue(etcd::Client& client, const std::string& name, const etcd::Deadline& bound);

// --holders: whether contender `i` of `queue` (in the order they take the
// lock) holds it with its own N `holders` (0: it is exclusive): it is
// first, or fewer than N are ahead of it and none of those is exclusive (a
// value without "holders": an earlier looplock, etcdctl lock, a run without
// --holders). When not, `exclusive_ahead` (if given) is set to the nearest
// exclusive contender ahead, if any.
bool contender_holds(const std::vector<etcd::KeyValue>& queue, size_t i, int holders,
                     std::optional<etcd::KeyValue>* exclusive_ahead = nullptr);
// A contender's N from its value (0: exclusive).
int contender_holders(const etcd::KeyValue& kv);

// Whether a contender's holder value proves its looplock dead on this host
// (sys::proven_dead, os/process.hpp), and the words that say so ("; its looplock is dead
// (this host): its key goes when its lease expires, within 10s"), empty
// when it is not.
std::string dead_contender_note(const Json& value);

// -p coalesce: the notes of absorbed runs under etcd::absorbed_root(), each
// with the contender of `queue` it belongs to: the waiter named by its key's
// lease, or the same looplock (host, pid, pid_start) queued again under a
// new lease after its own expired; none when its waiter left the queue.
struct AbsorbedNote {
  etcd::KeyValue kv;
  long long waiter_lease = 0;       // 0: its key names none (not a note's key)
  Json value;                       // the note (an object; null when it is not JSON)
  std::optional<size_t> owner;      // its contender's index in `queue`
  std::string operation() const;
  Json waiter() const;              // {"host", "pid", ...} as the note names it ({} when it does not)
  // Not a note looplock writes (its key, or its value without the
  // operation or the waiter's pid): nobody runs for it; it is deleted.
  bool damaged() const;
};
std::vector<AbsorbedNote> sort_absorbed(const std::string& root, const std::vector<etcd::KeyValue>& notes,
                                        const std::vector<etcd::KeyValue>& queue);
// Whether an absorbed run's tick needs no run any more: `last`, its
// operation's run in the run ledger, ended and started after it, or (with
// --once-per) its slot held the absorbed run's start (that run would have
// skipped).
bool absorbed_covered(const AbsorbedNote& note, const std::optional<RunEntry>& last);

// Whether cluster lock `name` is held through `key` by looplock `pid` on
// `host` (a nested looplock confirms that its outer one holds the cluster
// lock it asks for): empty when it is; else why not (etcd's error, or who
// holds it instead).
std::string confirm_cluster_holder(etcd::Client& client, const std::string& name, const std::string& key,
                                   const std::string& host, long long pid, const etcd::Deadline& bound);

// The fix for a failure's cause, in looplock's options (empty for None).
// `endpoint`: the endpoint it is about ("http://HOST:PORT").
std::string cause_hint(etcd::Cause cause, std::string_view endpoint);

// TLS and authentication, from the options; the password file is read here.
struct ClusterAccess {
  etcd::Security tls;
  std::string user;
  std::string password;
};
// Throws Fatal 64 when a file named by an option cannot be read.
ClusterAccess cluster_access(const ClusterSettings& settings, const Logger& log);

class ClusterLock {
public:
  // `kill_after`: the effective kill-after of the lease's deadlines
  // (ClusterSettings::lease_kill_after, resolved by the command line).
  ClusterLock(etcd::Transport& transport, std::vector<etcd::Endpoint> endpoints, std::string name, int ttl_s,
              Duration kill_after, const Logger& log, const ClusterAccess& access = {},
              etcd::Clock& clock = etcd::system_clock());
  ~ClusterLock();  // release(), if still held
  ClusterLock(const ClusterLock&) = delete;
  ClusterLock& operator=(const ClusterLock&) = delete;

  // Grants the lease and waits for the lock under `plan`, the deadline
  // counting from `start`; `who` becomes the key's value. Rides out etcd
  // being unavailable while it waits (renewing the lease; a blocking wait
  // until etcd answers again). Throws Fatal 69 when etcd cannot be reached at
  // all (within the deadline; 5 s for single_flight and blocking) or answers
  // with an error that waiting will not mend.
  Acquisition acquire(const WaitPlan& plan, Instant start, ClusterHolder who);

  // The lease, as the job loop sees it (on the monotonic clock).
  Instant next_renewal() const { return next_renewal_; }  // when renew() should next be called
  // One renewal round (attempts with failover) that returns by
  // `return_by`. False only when etcd says the lease is gone (lost_why()
  // then says so); true when renewed, or when no answer came (the deadlines
  // have not moved then: next_renewal() is soon). A signal of
  // `interrupt_on` that becomes pending ends the round early, within about a
  // second (no answer, as above).
  bool renew(Instant return_by, const sys::Interrupts* interrupt_on = nullptr);
  Instant term_by() const;  // expiry − kill-after − margin: TERM the job by then unless renewed
  Instant kill_by() const;  // expiry − margin: KILL the job by then
  Instant expiry() const;   // send time of the last answered grant/keepalive + TTL
  // The job loop gave up on the lease (its TERM deadline passed): lost()
  // from now on; `why` unless a reason is known already.
  void declare_lost(std::string why);
  // When the loss was known (etcd said the lease is gone, or declare_lost()
  // was called); none while it is not lost. For the lease_lost row.
  Deadline lost_at() const { return lost_at_; }
  // The kill-after of term_by(), when it is known only after construction.
  void set_kill_after(Duration d) {
    kill_after_ = d;
    if (token_ != 0) hold();  // holding: the renewal interval follows the kill-after
  }
  // The reason to give when term_by passed without a renewal.
  std::string overdue_why() const;

  // Revokes the lease, which deletes the lock key (bounded: by `bound`
  // when given and above 0, else by what the release needs; best effort).
  // An adopted lease is never revoked: it is its holder's.
  void release(std::optional<Duration> bound = std::nullopt);
  // A hold's later step (--hold): the hold's `lease`, under which its
  // holder holds the lock with `token` by `key`, renewed by this run too
  // while its command runs, so that the command ends before the lease can
  // expire, as any holder's does (even when the hold's holder no longer
  // renews it). One renewal now, by `by`: its TTL is the lease's own.
  // Returns nothing when adopted; else why not, and whether etcd said the
  // lease is gone (rather than not answering).
  struct AdoptFailure {
    std::string why;
    bool gone = false;
  };
  std::optional<AdoptFailure> adopt(long long lease, long long token, const std::string& key, Instant by);
  // Lets go without revoking the lease: a hold whose steps still run, and
  // renew it, leaves it to them (it expires once none does).
  void leave_lease() { adopted_ = true; }

  // The run ledger of --once-per: `operation`'s key (etcd::runs_key), read
  // inside the acquisition's own transaction when the lock is taken at once.
  void set_ledger_operation(const std::string& operation);
  struct LedgerEntry {
    std::optional<RunEntry> entry;
    bool damaged = false;        // a value that is not an entry
    long long mod_revision = 0;  // 0: no key
  };
  // Without the lock (before queuing, or once a wait ended): the entry, or
  // the failure when etcd does not answer by `deadline`.
  std::variant<LedgerEntry, sys::Failure> peek_ledger(Instant deadline);
  // Holding the lock: the entry as the acquisition's transaction read it, or
  // read now (linearizable). Throws Fatal 69 when etcd does not answer.
  LedgerEntry ledger(Instant deadline);
  // Writes `entry`, guarded by the fencing token and the revision last read
  // or written: none when written; else why not (etcd rejected it: the lease
  // is gone, or another wrote meanwhile; or it did not answer).
  std::optional<sys::Failure> write_ledger(const RunEntry& entry, Instant deadline);

  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  long long lease() const { return lease_id_; }
  long long fencing_token() const { return token_; }
  int ttl_s() const { return ttl_s_; }
  Duration kill_after() const { return kill_after_; }
  bool lost() const { return lost_ || gone_; }
  const std::string& lost_why() const { return why_; }
  Duration since_last_keepalive() const { return now() - last_ok_; }
  // Whether the last renewal round got no answer.
  bool renewal_failing() const { return renewal_failing_; }
  // Set when acquire() ended Busy, TimedOut or Coalesced: who held the lock.
  const std::optional<Json>& blocker() const { return blocker_; }
  // --holders, set with blocker(): every contender that held it then (each
  // value with its fencing_token), the first one's included.
  const std::vector<Json>& holders() const { return holders_; }
  // -p coalesce. Coalesced: the waiter queued ahead that absorbed this run
  // (its value). TimedOut, as such a waiter: how many runs it absorbed
  // (nullopt when etcd could not say).
  const std::optional<Json>& coalesced_into() const { return coalesced_into_; }
  std::optional<int> absorbed() const { return absorbed_; }
  // A coalescing waiter's wait ended by a signal that would end looplock
  // (held back meanwhile, sys::hold_ending_signals): that signal; else 0.
  int seat_signal() const { return seat_signal_; }
  // This run's start (wall clock, ms): what a waiter that absorbs it is
  // told, with --once-per.
  void set_start_wall_ms(long long ms) { start_wall_ms_ = ms; }
  // -p coalesce, once every lock is taken (the command is to run, or be
  // judged by --once-per): the notes of the runs this run absorbed while it
  // waited, and those a waiter of its operation that died left behind, read
  // (once). settle_absorbed(): the run does their work (`runs`: its command
  // starts, which says so, naming a dead waiter in a warning; else its
  // slot's run did it): their notes are deleted. One that held the cluster
  // lock and did neither (the local lock, an error) says at its release
  // that they never ran.
  void take_absorbed();
  void settle_absorbed(bool runs);
  // Held, as the waiter that absorbed later runs (take_absorbed()): the
  // newest start among them (nullopt: none, an earlier version's notes, or
  // etcd did not say).
  std::optional<long long> newest_absorbed_start_ms();
  const std::string& endpoint() const { return client_.current_endpoint(); }

private:
  template <typename T>
  [[noreturn]] void unavailable(const std::string& what, const etcd::Result<T>& r) const;
  bool grant(Instant deadline, etcd::Result<long long>& r);
  // A wait in the queue, step by step: join it (one transaction), read where
  // we stand, watch the key before ours, renew the lease between steps.
  struct Queue {
    long long my_rev = 0;                  // our keys' create revision, once queued
    std::optional<etcd::KeyValue> before;  // the contender just before us, to watch
    long long watch_from = 0;
    bool said_waiting = false;
    // --holders: waiting for any contender ahead to go, not only the one
    // just before: the whole prefix's deletions are watched.
    bool any_ahead = false;
  };
  // What a step found: the lock is ours, go on to the next step, or start
  // the round again.
  enum class Step { Ours, Next, Again, Coalesced };
  Acquisition wait_in_queue(Deadline deadline);
  Step place(Queue& q, const std::vector<etcd::KeyValue>& queue, long long revision, Instant step_end);
  void renew_in_queue(Queue& q, Instant t0, Deadline deadline);
  Step join(Queue& q, Instant step_end);
  Step read_queue(Queue& q, Instant step_end);
  void watch_before(Queue& q, Instant step_end);
  void note_blocker(long long my_rev);
  // -p coalesce, on arrival: a coalescing waiter of the same operation
  // waiting between the holder and us absorbs this run (a note beside its
  // key); or the queue is to be read again (it changed meanwhile).
  enum class Absorb { No, Yes, ReadAgain };
  Absorb coalesced(const std::vector<etcd::KeyValue>& queue, std::vector<etcd::KeyValue>::const_iterator mine,
                   Instant step_end);
  Absorb absorb_into(const Json& waiter, const etcd::KeyValue& w,
                     const std::vector<std::pair<std::string, long long>>& guards, Instant step_end);
  void count_absorbed();
  struct Taken {
    long long own = 0;                                          // this run's own notes
    std::vector<std::string> damaged;                           // keys of damaged ones left behind
    std::vector<std::pair<long long, std::vector<Json>>> left;  // a dead waiter's lease, the waiter of each note to run for
  };
  Taken choose_absorbed(const std::vector<AbsorbedNote>& notes, const std::vector<etcd::KeyValue>& queue,
                        const std::optional<RunEntry>& last);
  void say_left_behind(long long lease, const std::vector<Json>& waiters);
  Taken taken_;  // take_absorbed()'s choice, which settle_absorbed() deletes
  void name_dead_waiter(const Json& waiter, long long lease, Instant step_end);
  // Whether the contender `mine` holds the lock: it is first, or (--holders
  // N) fewer than N contenders are ahead of it and none of them is
  // exclusive. Else `blocking`: the one to watch (the nearest exclusive
  // contender ahead), or none (any of those ahead).
  bool holds(const std::vector<etcd::KeyValue>& queue, std::vector<etcd::KeyValue>::const_iterator mine,
             std::optional<etcd::KeyValue>& blocking) const;
  Acquisition take_at_once_as_holder(Instant reach_by);
  // The ledger read a transaction ended with, taken off its ranges.
  std::optional<etcd::RangeResult> pop_ledger_read(etcd::TxnResult& r) const;
  bool acquired(long long revision, bool waited);
  // The lock is ours: renew at the holder's interval from now on.
  void hold();
  std::optional<Json> holder_of(const etcd::KeyValue& kv, Instant deadline);
  void note_unavailable(const std::string& error);
  void note_answering();
  std::string holder_value(bool with_token) const;
  Instant now() const { return clock_.now(); }
  // A call's bounds: by `at`, each attempt the TTL's (lease_timing::attempt()).
  etcd::Deadline bounded_by(Instant at) const { return {.at = at, .attempt = lease_timing::attempt(ttl_s_)}; }

  etcd::Clock& clock_;
  etcd::Client client_;
  std::string name_;
  std::vector<std::string> prefixes_;  // etcd::contender_prefixes(name_)
  int ttl_s_;
  Duration kill_after_;
  const Logger& log_;
  ClusterHolder who_;
  long long lease_ = 0;            // the live lease (0: none granted, or released)
  long long lease_id_ = 0;         // the lease the lock was taken with (kept after release, for reports)
  std::vector<std::string> keys_;  // our key under each of prefixes_
  std::string key_;                // keys_[0]
  long long token_ = 0;
  Instant last_ok_{};  // send time of the last answered grant or keepalive
  Duration ttl_granted_{0};
  Duration renewal_{0};  // how often it renews: a waiter's interval, then a holder's (settings/lease_timing.hpp)
  Instant next_renewal_{};
  bool arrival_checked_ = false;  // -p coalesce: the queue was read once since we joined it
  std::optional<Json> coalesced_into_;
  std::optional<int> absorbed_;
  std::optional<long long> absorbed_newest_ms_;  // take_absorbed()
  bool absorbed_read_ = false;                   // take_absorbed() ran (this acquisition)
  bool absorbed_settled_ = false;                // settle_absorbed() or count_absorbed() ran (this acquisition)
  std::vector<long long> own_leases_;            // every lease granted to this run (one expired: queued again)
  std::vector<std::pair<long long, long long>> named_dead_;  // dead waiters named on arrival: lease, runs named
  int seat_signal_ = 0;
  const sys::Interrupts* seat_interrupts_ = nullptr;  // while a coalescing waiter waits: the ending signals
  long long start_wall_ms_ = 0;
  bool adopted_ = false;  // the lease is a hold's (adopt()): never revoked here
  bool gone_ = false;  // etcd said the lease is gone
  bool lost_ = false;  // the job loop declared it lost
  Deadline lost_at_;
  bool update_value_ = false;  // acquired after waiting: the next renewal rewrites acquired_at
  std::string acquired_at_;
  bool renewed_ = false;          // the last renew() renewed
  bool renewal_failing_ = false;  // the last renewal round got no answer
  bool said_unavailable_ = false;
  bool unavailable_now_ = false;
  bool silent_ = false;  // the last round of the watch timed out: etcd may have stopped answering
  std::string last_error_;  // what the last request that got no answer failed with (overdue_why())
  std::string why_;
  std::optional<Json> blocker_;
  std::vector<Json> holders_;
  void note_holders(const std::vector<etcd::KeyValue>& queue);
  std::string ledger_key_;  // empty: no ledger (no --once-per)
  std::optional<etcd::RangeResult> ledger_at_acquisition_;
  long long ledger_mod_ = 0;
};

}  // namespace looplock
