#include "app.hpp"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>

#include "cluster.hpp"
#include "cluster_exec.hpp"
#include "duration.hpp"
#include "error.hpp"
#include "etcd.hpp"
#include "exit_codes.hpp"
#include "holder.hpp"
#include "incident.hpp"
#include "inspect.hpp"
#include "lock_id.hpp"
#include "lockfile.hpp"
#include "nesting.hpp"
#include "procfs.hpp"
#include "spawn.hpp"
#include "survey.hpp"
#include "sys.hpp"
#include "terminal.hpp"
#include "verdict.hpp"
#include "version.hpp"

namespace looplock {

namespace {

constexpr long long kMs = 1'000'000LL;
constexpr long long kSec = 1'000'000'000LL;

std::string lock_display(const std::string& dir) {
  return dir + (dir.ends_with('/') ? "" : "/") + kLockName;
}


Outcome finish(int wait_status) { return {Outcome::Kind::LikeWaitStatus, wait_status}; }
Outcome exit_status(int status) { return {Outcome::Kind::ExitStatus, status}; }

// --- the lock, as this run names it -------------------------------------------

struct Target {
  std::string canonical_dir;
  std::string lock_id;
  std::string loop;  // DIR's base name
};

Target target_of(const LockDir& dir, const std::string& given) {
  const std::string canonical = canonical_lock_path(dir.fd.get(), given);
  Target t;
  t.canonical_dir = canonical.substr(0, canonical.size() - std::string_view(kLockName).size() - 1);
  t.lock_id = lock_id_for_path(canonical);
  auto slash = t.canonical_dir.rfind('/');
  t.loop = slash == std::string::npos ? t.canonical_dir : t.canonical_dir.substr(slash + 1);
  if (t.loop.empty()) t.loop = "/";
  return t;
}

// --- who is in the way -------------------------------------------------------------
//
// The local lock and the cluster lock are reported the same way: a skip line,
// or a timeout line with its incident row, naming what is held and by whom.

struct Blocker {
  std::string what;          // "DIR/.state.lock", or "cluster lock NAME (etcd)"
  std::string who;           // "pid 1234 (agent cron, operation tick.py, ...)"
  std::string inspect_hint;  // the command that shows more
  std::optional<Verdict> verdict;  // the local lock's
  Json cluster = nullptr;    // the incident row's "cluster" object
  std::string confirm = "the holder";  // whom the operator confirms stalled: "pid 12", "pids 12, 13"
  bool many = false;                   // more than one of them
  std::string action_extra;  // added to the policy's operator_action
};

// The holders as hints for a later look (the kernel's locks, as found).
std::vector<procfs::KernelLock> as_hint(const LockFacts& f) {
  std::vector<procfs::KernelLock> out;
  for (const auto& h : f.holders) {
    if (!h.exited) out.push_back({h.pid, h.exclusive, h.locked_by});
  }
  return out;
}

Blocker local_blocker(const Options& o, const LockFile& file, const std::vector<procfs::KernelLock>& hint) {
  Blocker b;
  b.what = lock_display(o.dir);
  b.verdict = judge(survey_held(file, b.what, hint));
  b.who = holder_phrase(*b.verdict);
  b.inspect_hint = "looplock --inspect " + o.dir;
  if (!b.verdict->confirm.empty()) {
    b.confirm = pids_text(b.verdict->confirm);
    b.many = b.verdict->confirm.size() > 1;
  }
  return b;
}

Blocker cluster_blocker(const Options& o, const ClusterLock& c, const std::string& this_host) {
  Blocker b;
  b.what = "cluster lock " + printable(c.name()) + " (etcd)";
  const ClusterVerdict v = judge_cluster(c.blocker(), this_host);
  const bool here = v.on_this_host;
  b.who = v.holder;
  b.confirm = v.confirm;
  b.inspect_hint = "looplock --inspect --etcd " + o.etcd + " " + o.dir;
  b.cluster = Json{{"lock_name", c.name()}, {"endpoint", c.endpoint()},
                   {"holder", c.blocker() ? *c.blocker() : Json(nullptr)}};
  b.action_extra = std::string("; the cluster lock ") + c.name() + " is held " +
                   (here ? "by another looplock on this host" : "on another host") + ": inspect it with '" +
                   b.inspect_hint + "'" + (here ? "" : " on any host") + ".";
  return b;
}

Json blocker_fields(const Options& o, const Blocker& b, const std::string& lock_id) {
  Json j = {{"lock_id", lock_id}, {"policy", policy_name(o.policy)}, {"holder_pids", Json::array()}, {"holder", nullptr}};
  if (const auto& v = b.verdict) {
    for (const auto& h : v->holders) j["holder_pids"].push_back(h.pid);
    if (v->record == RecordState::Current) j["holder"] = holder_to_json(*v->read);
    j["record_status"] = record_state_name(v->record);
    if (v->read && v->record != RecordState::Current) j["record"] = holder_to_json(*v->read);
    if (!v->warnings.empty()) j["warnings"] = v->warnings;
  }
  if (!b.cluster.is_null()) j["cluster"] = b.cluster;
  return j;
}

void report_skip(const Options& o, const Blocker& b, const std::string& lock_id, const Logger& log) {
  log.result("noop-locked",
             "noop-locked: " + b.what + " is held by " + b.who + "; skipped " + o.operation + " (policy single_flight)",
             blocker_fields(o, b, lock_id));
}

Incident incident_of(const Options& o, const Context& ctx, const std::string& lock_id, std::string error_code) {
  Incident inc;
  inc.at = sys::utc_now_iso8601();
  inc.error_code = std::move(error_code);
  inc.lock_id = lock_id;
  inc.policy = std::string(policy_name(o.policy));
  inc.waiter_pid = ctx.pid;
  inc.waiter_agent = o.agent;
  inc.waiter_operation = o.operation;
  return inc;
}

// The row is the audit trail of what looplock did: appended first (one
// write), and a failure to append only adds a warning.
void append_row(const Options& o, const LockDir& dir, const Incident& inc, const Logger& log) {
  if (int err = append_incident(dir.fd.get(), encode_incident(inc)); err != 0) {
    log.warn("incident_append_failed",
             errno_message("cannot append the incident row to " + o.dir + "/" + kIncidentsName, err));
  }
}

void report_timeout(const Options& o, const Context& ctx, const LockDir& dir, const Blocker& b, const WaitPlan& plan,
                    long long waited_ns, const std::string& lock_id, const Logger& log) {
  Incident inc = incident_of(o, ctx, lock_id, "lock_acquire_timeout");
  inc.deadline_ms = plan.deadline_ns / kMs;
  inc.waited_ms = waited_ns / kMs;
  if (const auto& v = b.verdict) {
    for (const auto& h : v->holders) inc.holder_pids.push_back(h.pid);
    if (v->record == RecordState::Current) {
      inc.holder = v->read;
      inc.holder_alive = v->read_alive;
    }
    inc.record_status = record_state_name(v->record);
    if (v->read && v->record != RecordState::Current) inc.record = v->read;
    inc.warnings = v->warnings;
  }
  inc.cluster = b.cluster;
  inc.operator_action = operator_action(o.policy, b.confirm, b.many) + b.action_extra;
  append_row(o, dir, inc, log);
  Json fields = blocker_fields(o, b, lock_id);
  fields["waited_ms"] = inc.waited_ms;
  fields["deadline_ms"] = inc.deadline_ms;
  log.error("lock_acquire_timeout",
            "lock_acquire_timeout: " + b.what + " still held after " + format_duration(waited_ns) + " by " + b.who +
                "; gave up " + o.operation + " (policy " + inc.policy + ")",
            "Run '" + b.inspect_hint + "' to see the holder; never delete the lock file.", fields);
}

// --- waiting -------------------------------------------------------------------
//
// Reports the wait: with -v once (naming the holder); on a terminal a status
// line rewritten in place at most once a second (whom it waits for, how long
// so far, how long is left), erased when the wait ends. For a wait that may
// time out, it also notes who holds the lock when the wait starts, so that the
// timeout's report only has to confirm it (cheaply) instead of reading
// /proc/locks after the deadline.
class WaitReporter : public AcquireObserver {
public:
  WaitReporter(const Options& o, const Logger& log, const WaitPlan& plan, long long start_ns)
      : o_(o), log_(log), plan_(plan), start_ns_(start_ns),
        status_line_(!log.is_quiet() && log.is_text() && isatty(log.fd()) == 1) {}

  void on_wait(const LockFile& file) override {
    wait_started_ns_ = sys::monotonic_ns();
    if (!log_.is_verbose() && plan_.kind != WaitPlan::Kind::Bounded && !status_line_) return;
    const LockFacts facts = survey_held(file, lock_display(o_.dir));
    holders_at_start_ = as_hint(facts);
    who_ = holder_phrase(judge(facts));
    log_.verbose("waiting", "waiting for " + who_ + " on " + lock_display(o_.dir),
                 {{"policy", policy_name(o_.policy)}});
  }
  const std::vector<procfs::KernelLock>& holders_at_start() const { return holders_at_start_; }
  void on_replaced(int count) override {
    log_.warn("lock_file_replaced", lock_display(o_.dir) +
                                        " was deleted or replaced while looplock waited for it; locking the new file"
                                        " (never delete the lock file)",
              {{"count", count}});
  }

  long long tick_interval_ns() const override { return status_line_ ? kSec / 4 : 0; }
  void on_tick() override {
    const long long now = sys::monotonic_ns();
    if (now - wait_started_ns_ < kSec || (drawn_ && now - last_draw_ns_ < kSec)) return;
    last_draw_ns_ = now;
    std::optional<long long> left;
    if (plan_.kind == WaitPlan::Kind::Bounded) left = start_ns_ + plan_.deadline_ns - now;
    winsize ws{};
    const size_t width = ioctl(log_.fd(), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col - 1u : 79u;
    const std::string line = wait_status_line(now - wait_started_ns_, left, printable(who_),
                                              printable(lock_display(o_.dir)), width);
    (void)sys::write_all(log_.fd(), "\r" + line + "\x1b[K");
    drawn_ = true;
  }
  void on_wait_end() override {
    if (drawn_) (void)sys::write_all(log_.fd(), "\r\x1b[K");
    drawn_ = false;
  }

private:
  const Options& o_;
  const Logger& log_;
  const WaitPlan& plan_;
  long long start_ns_;
  bool status_line_;
  std::vector<procfs::KernelLock> holders_at_start_;
  std::string who_ = "another process";
  long long wait_started_ns_ = 0;
  long long last_draw_ns_ = 0;
  bool drawn_ = false;
};

// --- the command's side ---------------------------------------------------------

// The command's environment but for the lock descriptor's number, which is
// known once the lock is taken (add_lock_fd): built before waiting, so that
// the hand-off from the previous holder does not wait for it.
EnvList command_env(const Context& ctx, const Options& o, const Target& t, const ClusterLock* cluster) {
  std::vector<std::pair<std::string_view, std::string>> set = {
      {env_name::kDir, t.canonical_dir},
      {env_name::kLockId, t.lock_id},
      {env_name::kPolicy, std::string(policy_name(o.policy))},
      {env_name::kHolderPid, std::to_string(ctx.pid)},
  };
  if (cluster) {
    set.emplace_back(env_name::kFencingToken, std::to_string(cluster->fencing_token()));
    set.emplace_back(env_name::kEtcdKey, cluster->key());
    set.emplace_back(env_name::kEtcdLease, etcd::lease_hex(cluster->lease()));
  }
  return env_with(ctx.env, set, {env_name::kFd, env_name::kHolderFd, env_name::kEtcdPassword});
}

void add_lock_fd(EnvList& env, int lock_fd, bool pass_fd) {
  env.push_back(std::string(env_name::kHolderFd) + "=" + std::to_string(lock_fd));
  if (pass_fd) env.push_back(std::string(env_name::kFd) + "=" + std::to_string(lock_fd));
}

CommandSpec spec_for(const Options& o, EnvList env) {
  CommandSpec spec;
  spec.argv = o.command;
  spec.env = std::move(env);
  spec.kill_after_ns = signal_kill_after(o);
  spec.max_time_ns = o.max_time_ns;
  spec.max_time_kill_after_ns = max_time_kill_after(o);
  return spec;
}

RunOutcome outcome_of(int wait_status) {
  if (WIFSIGNALED(wait_status)) return RunOutcome::Signaled;
  return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0 ? RunOutcome::Success : RunOutcome::Failure;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// The cluster lock's lease as the job loop sees it: its renewals, and the
// deadlines by which the job must have been sent TERM and KILL.
class ClusterLease final : public Lease {
public:
  explicit ClusterLease(ClusterLock& c) : c_(c) {}
  long long next_renewal_ns() const override { return c_.next_renewal_ns(); }
  bool renew(long long return_by_ns, const sigset_t& interrupt_on) override {
    return c_.renew(return_by_ns, &interrupt_on);
  }
  long long term_by_ns() const override { return c_.term_by_ns(); }
  long long kill_by_ns() const override { return c_.kill_by_ns(); }

private:
  ClusterLock& c_;
};

// --- the rows about a job looplock ended ---------------------------------------------

Json job_details(const JobEnd& job) {
  return Json{{"ran_ms", (job.ended_ns - job.started_ns) / kMs},
              {"killed", job.killed},
              {"ran_after_term_ms", job.term_sent_ns ? (job.ended_ns - job.term_sent_ns) / kMs : 0}};
}

void report_max_time(const Options& o, const Context& ctx, const LockDir& dir, const std::string& lock_id,
                     const std::optional<HolderRecord>& record, const JobEnd& job, const Logger& log) {
  Incident inc = incident_of(o, ctx, lock_id, "max_time_exceeded");
  inc.deadline_ms = *o.max_time_ns / kMs;
  inc.waited_ms = (job.ended_ns - job.started_ns) / kMs;
  inc.holder = record;
  inc.holder_alive = record ? std::optional<bool>(true) : std::nullopt;
  inc.holder_pids = {ctx.pid};
  inc.details = job_details(job);
  inc.operator_action = std::string("The command ran longer than --max-time and looplock ended it (") +
                        (job.killed ? "it ignored TERM: KILL was needed" : "TERM sufficed") +
                        "); find out why it hung before the next run does too.";
  append_row(o, dir, inc, log);
  Json fields = {{"lock_id", lock_id}, {"policy", policy_name(o.policy)}, {"deadline_ms", inc.deadline_ms}};
  fields.update(inc.details);
  log.error("max_time_exceeded",
            "max_time_exceeded: " + o.operation + " ran longer than --max-time " + format_duration(*o.max_time_ns) +
                " and was ended (" + (job.killed ? "KILL was needed" : "TERM sufficed") + ") after " +
                format_duration(job.ended_ns - job.started_ns),
            "Find out why it hung; the lock was released once the whole job had ended.", fields);
}

void report_lease_lost(const Options& o, const Context& ctx, const LockDir& dir, const ClusterLock& c,
                       const std::optional<HolderRecord>& record, const std::string& lock_id, const JobEnd& job,
                       const Logger& log) {
  const std::string why = c.lost_why();
  Incident inc = incident_of(o, ctx, lock_id, "lease_lost");
  inc.deadline_ms = static_cast<long long>(c.ttl_s()) * 1000;
  inc.waited_ms = c.since_last_keepalive_ns() / kMs;
  inc.holder = record;
  if (record) inc.holder_alive = true;
  inc.holder_pids = {ctx.pid};
  inc.cluster = Json{{"lock_name", c.name()}, {"endpoint", c.endpoint()}, {"holder", nullptr},
                     {"fencing_token", c.fencing_token()}, {"lease", etcd::lease_hex(c.lease())}, {"why", why}};
  inc.details = job_details(job);
  inc.details["ran_after_loss_ms"] = c.lost_at_ns() ? std::max(job.ended_ns - c.lost_at_ns(), 0LL) / kMs : 0;
  inc.operator_action =
      "The etcd lease was lost while the command ran (" + why + "), so another host may have taken the lock: the "
      "command was ended (" + (job.killed ? "KILL was needed" : "TERM sufficed") + "). Check etcd's health and the "
      "network between this host and etcd; make writers check LOOPLOCK_FENCING_TOKEN so a stale holder is refused.";
  append_row(o, dir, inc, log);
  Json fields = {{"lock_id", lock_id}, {"cluster", inc.cluster}};
  fields.update(inc.details);
  log.error("lease_lost",
            "lease_lost: the etcd lease of cluster lock " + printable(c.name()) + " was lost while " + o.operation +
                " ran: " + printable(why) + "; the command was ended (" +
                (job.killed ? "KILL was needed" : "TERM sufficed") + ")",
            "Another host may hold the lock now. Check etcd (" + c.endpoint() + ") and the network.", fields);
}

// --- after the release ---------------------------------------------------------------

// How long a process that is ending may take to close the lock descriptor
// before it counts as keeping the lock.
constexpr long long kEndingGraceNs = 200 * kMs;

// The descendants of looplock that still hold the lock through the inherited
// descriptor once the job has ended. Those that are ending (exiting in the
// kernel, or in the job's group when looplock sent it a signal: a TERM
// forwarded from timeout(1) takes a moment to act) get up to 200 ms to close
// it; what still holds it then is a leak, named every time. Only a run that
// finds a holder here pays the wait.
std::vector<pid_t> leaked_holders(pid_t self, const struct stat& file, const JobEnd& job) {
  std::vector<pid_t> leaked = procfs::pids_holding_flock(procfs::descendants(self), file);
  const long long until = sys::monotonic_ns() + kEndingGraceNs;
  while (!leaked.empty() && sys::monotonic_ns() < until) {
    const bool ending = std::any_of(leaked.begin(), leaked.end(), [&](pid_t p) {
      const auto st = procfs::proc_stat(p);
      return !st || st->exiting() || (job.signalled && st->pgrp == job.pgid);
    });
    if (!ending) break;
    timespec pause{0, 5'000'000};
    nanosleep(&pause, nullptr);
    leaked = procfs::pids_holding_flock(leaked, file);
  }
  return leaked;
}

// --- nesting ---------------------------------------------------------------------------

// Inside a looplock that already holds this lock: the command runs at once.
// (No open, so no ownership check: the outer looplock made it; the command
// may run as another user, under su or runuser, with the descriptor kept.)
std::optional<Outcome> run_nested(const Options& o, const Context& ctx, const LockDir& dir,
                                  const InheritedSignals& inherited, const Logger& log, RunFacts& facts) {
  struct stat lock_st {};
  if (!env_get(ctx.env, env_name::kHolderFd) ||
      fstatat(dir.fd.get(), kLockName, &lock_st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(lock_st.st_mode)) {
    return std::nullopt;
  }
  auto outer = find_outer_holder(ctx.env, dir.fd.get(), lock_st, !o.shared, ctx.pid);
  if (!outer) return std::nullopt;
  log.verbose("nested", std::string("already held ") +
                            (outer->inherited ? "through the lock descriptor this run inherited"
                                              : "by looplock pid " + std::to_string(outer->pid) + " (an ancestor)") +
                            "; running inside its critical section");
  CommandSpec spec = spec_for(o, ctx.env);
  if (o.close_fd) {
    // -o holds inside a nested run too: the command gets no lock fd.
    if (auto fd = inherited_lock_fd(ctx.env, lock_st); fd && fcntl(*fd, F_SETFD, FD_CLOEXEC) != 0) {
      fail_errno(exit_code::kOsError, "cannot keep the lock descriptor from the command (-o)", errno);
    }
    spec.env = env_with(ctx.env, {}, {env_name::kFd});
  }
  if (o.no_fork) exec_command(spec, inherited);
  const JobEnd job = run_command(spec, inherited, log);
  facts.ran_ns = job.ended_ns - job.started_ns;
  if (job.ended_by == JobEnd::EndedBy::MaxTime) {
    facts.outcome = RunOutcome::MaxTime;
    return exit_status(exit_code::kMaxTime);
  }
  facts.outcome = outcome_of(job.status);
  return finish(job.status);
}

}  // namespace

Outcome run(const Options& o, const Context& ctx, const Logger& log, RunFacts& facts) {
  if (o.mode == Mode::Inspect) return exit_status(inspect(o, log, ctx.etcd));

  const InheritedSignals inherited = take_signal_control();
  LockDir dir = open_lock_dir(o.dir);
  if (auto fs = network_file_system(dir.fd.get())) {
    log.warn("network_file_system", o.dir + " is on a network file system (" + *fs +
                                        "): flock(2) there may not exclude processes on other hosts; looplock "
                                        "supports local file systems only");
  }
  const Target t = target_of(dir, o.dir);
  facts.lock_id = t.lock_id;
  log.set_lock_id(t.lock_id);
  facts.loop = t.loop;
  const LockMode mode = o.shared ? LockMode::Shared : LockMode::Exclusive;

  if (auto nested = run_nested(o, ctx, dir, inherited, log, facts)) return *nested;

  // Acquire: the cluster lock first, the local one second, always in that
  // order (so that two hosts never wait for each other crosswise); the
  // deadline counts from looplock's start and covers both. A skip or a
  // timeout on either is reported the same way.
  const WaitPlan plan = wait_plan(o.policy, o.timeout_ns);
  std::optional<ClusterLock> cluster;
  if (!o.etcd.empty()) {
    cluster.emplace(*ctx.etcd, etcd::parse_endpoints(o.etcd).endpoints, cluster_lock_name(o.lock_name, t.canonical_dir), o.ttl_s,
                    o.lease_kill_after_ns, log, cluster_access(o, log));
    const std::string host = host_name();
    const auto got = cluster->acquire(plan, ctx.start_ns, ClusterHolder{host, ctx.pid, o.agent, o.operation, {}, {}, 0});
    facts.waited_ns = sys::monotonic_ns() - ctx.start_ns;
    if (got == ClusterLock::Outcome::Busy) {
      report_skip(o, cluster_blocker(o, *cluster, host), t.lock_id, log);
      facts.outcome = RunOutcome::Skipped;
      return exit_status(o.skip_exit_code);
    }
    if (got == ClusterLock::Outcome::TimedOut) {
      report_timeout(o, ctx, dir, cluster_blocker(o, *cluster, host), plan, facts.waited_ns, t.lock_id, log);
      facts.outcome = RunOutcome::Timeout;
      return exit_status(o.conflict_exit_code);
    }
    log.verbose("acquired", "cluster lock " + printable(cluster->name()) + " acquired on etcd after " +
                                format_duration(facts.waited_ns) + " (fencing token " +
                                std::to_string(cluster->fencing_token()) + ")",
                {{"lock_name", cluster->name()}, {"fencing_token", cluster->fencing_token()},
                 {"waited_ms", facts.waited_ns / kMs}});
  }

  // Work that does not need the lock is done before waiting for it.
  EnvList env = command_env(ctx, o, t, cluster ? &*cluster : nullptr);
  const std::string pid_start = mode == LockMode::Exclusive ? procfs::own_start().value_or("") : "";

  WaitReporter reporter(o, log, plan, ctx.start_ns);
  AcquireResult res = acquire_lock(dir, plan, mode, reporter, ctx.start_ns);
  facts.waited_ns = res.waited_ns;
  if (res.status == AcquireResult::Status::Busy) {
    report_skip(o, local_blocker(o, res.file, {}), t.lock_id, log);
    facts.outcome = RunOutcome::Skipped;
    return exit_status(o.skip_exit_code);
  }
  if (res.status == AcquireResult::Status::TimedOut) {
    report_timeout(o, ctx, dir, local_blocker(o, res.file, reporter.holders_at_start()), plan, res.waited_ns,
                   t.lock_id, log);
    facts.outcome = RunOutcome::Timeout;
    return exit_status(o.conflict_exit_code);
  }

  // Held: record who holds it.
  LockFile& file = res.file;
  log.verbose("acquired", std::string(mode == LockMode::Shared ? "shared" : "exclusive") + " lock on " +
                              lock_display(o.dir) + " acquired after " + format_duration(res.waited_ns),
              {{"lock_id", t.lock_id}, {"waited_ms", res.waited_ns / kMs}});
  std::optional<HolderRecord> record;
  if (mode == LockMode::Exclusive) {
    if (file.read_only) {
      log.warn("read_only_lock_file", lock_display(o.dir) +
                                          " is read-only for looplock: the lock is held, but no holder record can be written");
    } else {
      record = HolderRecord{t.lock_id, ctx.pid, pid_start, o.agent, o.operation,
                            std::string(policy_name(o.policy)), sys::utc_now_iso8601(), std::nullopt, o.no_fork};
      if (!write_holder(file.fd.get(), *record)) {
        log.warn("holder_write_failed", errno_message("cannot write the holder record into " + lock_display(o.dir), errno));
        record.reset();
      }
    }
  }

  // Run the command's job.
  add_lock_fd(env, file.fd.get(), !o.close_fd);
  CommandSpec spec = spec_for(o, std::move(env));
  spec.pass_fd = o.close_fd ? -1 : file.fd.get();
  std::optional<ClusterLease> lease;
  if (cluster) spec.lease = &lease.emplace(*cluster);
  JobEnd job;
  try {
    if (o.no_fork) exec_command(spec, inherited);
    job = run_command(spec, inherited, log);
  } catch (const Fatal&) {
    if (record) {
      record->released_at = sys::utc_now_iso8601();
      (void)write_holder(file.fd.get(), *record);
    }
    throw;
  }
  facts.ran_ns = job.ended_ns - job.started_ns;

  // Release. The command has ended; looplock still holds the lock. Was it
  // protecting the real file all along?
  const IntactCheck check = lock_intact(dir, file);
  if (!check.intact) {
    log.warn("intact_unknown",
             errno_message("cannot check whether " + lock_display(o.dir) + " is still the file that was locked", check.err) +
                 "; not reporting it as vanished");
  }
  const bool intact = check.intact.value_or(true);
  if (record && intact) {
    record->released_at = sys::utc_now_iso8601();
    if (!write_holder(file.fd.get(), *record)) {
      log.warn("holder_write_failed", errno_message("cannot write the release into " + lock_display(o.dir), errno));
    }
  }
  file.fd.reset();  // release

  // A process the command started may still hold the inherited lock fd: then
  // the lock stays held after looplock exits. (Checked after the release, so
  // that the next holder does not wait for it.)
  if (!o.close_fd) {
    if (auto leaked = leaked_holders(ctx.pid, file.st, job); !leaked.empty()) {
      const bool many = leaked.size() > 1;
      log.warn_always("lock_leaked", "the command exited, but " + pids_text(leaked) + " that it started still " +
                                         (many ? "hold " : "holds ") + lock_display(o.dir) +
                                         " through the inherited lock fd; the lock stays held until " +
                                         (many ? "they exit" : "it exits") +
                                         ". Use -o/--close for commands that start background processes",
                      {{"pids", leaked}});
    }
  }
  const int status = job.status;
  log.verbose("released", "released " + lock_display(o.dir) + "; the command " +
                              (WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                                   : "exited with " + std::to_string(shell_status(status))),
              {{"lock_id", t.lock_id}, {"exit_status", shell_status(status)}, {"ran_ms", facts.ran_ns / kMs}});

  // The rows about a job looplock ended are written once it has ended, so
  // that they can say how.
  if (job.ended_by == JobEnd::EndedBy::MaxTime) report_max_time(o, ctx, dir, t.lock_id, record, job, log);
  if (cluster) {
    // The job loop ended the job at the lease's TERM deadline: the lease is
    // lost from looplock's point of view even if etcd never said so.
    if (job.lease_lost && !cluster->lost()) cluster->declare_lost(cluster->overdue_why());
    if (job.lease_lost) report_lease_lost(o, ctx, dir, *cluster, record, t.lock_id, job, log);
    cluster->release();  // after the local lock, as promised
    log.verbose("released", "released cluster lock " + printable(cluster->name()) + " on etcd");
    if (job.lease_lost) {
      facts.outcome = RunOutcome::LeaseLost;
      return exit_status(exit_code::kLeaseLost);
    }
  }
  if (job.ended_by == JobEnd::EndedBy::MaxTime) {
    facts.outcome = RunOutcome::MaxTime;
    return exit_status(exit_code::kMaxTime);
  }
  facts.outcome = outcome_of(status);
  if (!intact) {
    const bool command_failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    log.error("loop_dir_vanished",
              "loop dir vanished mid-lock: " + lock_display(o.dir) +
                  " was deleted or replaced while the command ran, so the lock no longer protected it",
              command_failed ? "The command failed too; looplock exits with its status."
                             : "Check what removed it; never delete the lock file or the loop directory of a running loop.");
    if (!command_failed) {
      facts.outcome = RunOutcome::Error;
      return exit_status(exit_code::kVanished);
    }
  }
  return finish(status);
}

namespace {

// --metrics-dir: after every run that got as far as knowing its lock. A file
// that cannot be written is one warning: never another exit status.
void write_metrics(const Options& o, const RunFacts& facts, int status, long long start_wall_ms, const Logger& log) {
  if (o.metrics_dir.empty() || facts.lock_id.empty() || o.mode != Mode::Run) return;
  RunMetrics m;
  m.lock_id = facts.lock_id;
  m.loop = facts.loop;
  m.operation = o.operation;
  m.outcome = facts.outcome.value_or(RunOutcome::Error);
  m.exit_status = status;
  m.start_s = static_cast<double>(start_wall_ms) / 1000.0;
  m.end_s = static_cast<double>(sys::realtime_ms()) / 1000.0;
  m.wait_s = static_cast<double>(facts.waited_ns) / 1e9;
  m.duration_s = static_cast<double>(facts.ran_ns) / 1e9;
  if (std::string err = update_metrics_file(o.metrics_dir, m); !err.empty()) {
    log.warn("metrics_write_failed", "cannot update the metrics: " + err);
  }
}

}  // namespace

int main_program(int argc, char** argv, char** envp, etcd::Transport* etcd) {
  const long long now_ns = sys::monotonic_ns();
  const long long start_wall_ms = sys::realtime_ms();
  // Until the options are parsed, errors use the --log-format asked for, if
  // it can be told: with json, a usage error is a JSON line too.
  Logger log(Verbosity::Normal, requested_log_format(argc, argv));
  std::optional<Options> options;
  RunFacts facts;
  try {
    std::vector<std::string> args(argv, argv + argc);
    Context ctx{env_from(envp), getpid(), now_ns, etcd};
    // looplock-etcd: the deadline counts from when looplock started.
    if (auto handed = take_handed_start(ctx.env, now_ns); handed && etcd) ctx.start_ns = *handed;
    Environment penv{env_get(ctx.env, env_name::kAgent),       env_get(ctx.env, env_name::kEtcd),
                     env_get(ctx.env, env_name::kMetricsDir),  [] { return sys::user_name(getuid()); },
                     env_get(ctx.env, env_name::kEtcdCacert),  env_get(ctx.env, env_name::kEtcdClientCert),
                     env_get(ctx.env, env_name::kEtcdClientKey), env_get(ctx.env, env_name::kEtcdPassword)};
    const Options& o = options.emplace(parse_options(args, penv));
    if (o.mode == Mode::Help) {
      write_stdout(help_text());
      return exit_code::kOk;
    }
    if (o.mode == Mode::Version) {
      const bool helper = ctx.etcd != nullptr;  // this is looplock-etcd
      const std::string etcd_status = helper ? "available, built in (this is looplock-etcd)" : cluster_helper_status();
      write_stdout(version_text(build_info(helper), etcd_status));
      return exit_code::kOk;
    }
    log = Logger(o.verbosity, o.log_format);
    if (!o.etcd.empty() && !ctx.etcd) exec_cluster_helper(argv, ctx.env, ctx.start_ns);
    Outcome out = run(o, ctx, log, facts);
    const int status = out.kind == Outcome::Kind::LikeWaitStatus ? shell_status(out.value) : out.value;
    write_metrics(o, facts, status, start_wall_ms, log);
    if (out.kind == Outcome::Kind::LikeWaitStatus) exit_like(out.value);
    return out.value;
  } catch (const Fatal& e) {
    log.error(e.event(), e.what(), e.hint());
    if (options) write_metrics(*options, facts, e.status(), start_wall_ms, log);
    return e.status();
  } catch (const std::bad_alloc&) {
    // No allocation here: there may be nothing left to allocate.
    (void)sys::write_all(2, log.is_text() ? "looplock: out of memory\n"
                                          : "{\"level\":\"error\",\"event\":\"out_of_memory\",\"message\":\"out of memory\"}\n");
    return exit_code::kOsError;
  } catch (const std::exception& e) {
    log.error("internal_error", std::string("internal error: ") + e.what());
    return exit_code::kOsError;
  }
}

}  // namespace looplock
