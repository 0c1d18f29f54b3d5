#include "app.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "cluster.hpp"
#include "cluster_exec.hpp"
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
#include "sys.hpp"

namespace looplock {

namespace {

std::string lock_display(const std::string& dir) {
  return dir + (dir.ends_with('/') ? "" : "/") + kLockName;
}

std::string seconds_text(long long ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", static_cast<double>(ns) / 1e9);
  return buf;
}

// Reports the wait (-v) naming who blocks. For a wait that may time out, it
// also notes who holds the lock when the wait starts, so that the timeout's
// report only has to confirm it (cheaply) instead of reading /proc/locks
// after the deadline.
class WaitReporter : public AcquireObserver {
public:
  WaitReporter(const Options& o, const Logger& log, bool may_time_out)
      : o_(o), log_(log), may_time_out_(may_time_out) {}
  void on_wait(const LockFile& file) override {
    if (!log_.is_verbose() && !may_time_out_) return;
    HolderRead hr = read_holder(file.fd.get());
    holders_at_start_ = kernel_holders(hr, file.st);
    log_.verbose("waiting", "waiting for " + lock_display(o_.dir) + ", held by " + describe_holder(hr, holders_at_start_),
                 {{"policy", policy_name(o_.policy)}});
  }
  const std::vector<procfs::KernelLock>& holders_at_start() const { return holders_at_start_; }
  void on_replaced(int count) override {
    log_.warn("lock_file_replaced", lock_display(o_.dir) +
                                        " was deleted or replaced while looplock waited for it; locking the new file"
                                        " (never delete the lock file)",
              {{"count", count}});
  }

private:
  const Options& o_;
  const Logger& log_;
  bool may_time_out_;
  std::vector<procfs::KernelLock> holders_at_start_;
};

// The user's name: from /etc/passwd when it is there (one read, no NSS
// machinery on the hot path), else from getpwuid(3) (LDAP and other NSS
// sources), else the uid.
std::string user_name() {
  const std::string uid = std::to_string(getuid());
  if (auto passwd = sys::read_file("/etc/passwd", 4 << 20)) {
    std::string_view all = *passwd;
    while (!all.empty()) {
      auto nl = all.find('\n');
      std::string_view line = all.substr(0, nl);
      all = nl == std::string_view::npos ? std::string_view{} : all.substr(nl + 1);
      auto c1 = line.find(':');
      auto c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
      auto c3 = c2 == std::string_view::npos ? c2 : line.find(':', c2 + 1);
      if (c3 != std::string_view::npos && line.substr(c2 + 1, c3 - c2 - 1) == uid && c1 > 0) {
        return std::string(line.substr(0, c1));
      }
    }
  }
  if (passwd* pw = getpwuid(getuid()); pw && pw->pw_name) return pw->pw_name;
  return uid;
}

// The environment the command runs with.
// The command's environment but for the lock descriptor's number, which is
// known once the lock is taken (add_lock_fd): built before waiting, so that
// the hand-off from the previous holder does not wait for it.
EnvList command_env(const Context& ctx, const Options& o, const std::string& canonical_dir,
                    const std::string& lock_id, const ClusterLock* cluster) {
  std::vector<std::pair<std::string_view, std::string>> set = {
      {env_name::kDir, canonical_dir},
      {env_name::kLockId, lock_id},
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

Outcome finish(int wait_status) { return {Outcome::Kind::LikeWaitStatus, wait_status}; }
Outcome exit_status(int status) { return {Outcome::Kind::ExitStatus, status}; }

// The timeout is the result; its incident row is the audit trail, appended
// first (one write), and a failure to append only adds a warning.
void warn_if_not_appended(int err, const Options& o, const Logger& log) {
  if (err != 0) {
    log.warn("incident_append_failed",
             errno_message("cannot append the incident row to " + o.dir + "/" + kIncidentsName, err));
  }
}

void report_timeout(const Options& o, const Context& ctx, const LockDir& dir, const AcquireResult& res,
                    const WaitPlan& plan, const std::string& lock_id, const WaitReporter& reporter,
                    const Logger& log) {
  HolderRead hr = read_holder(res.file.fd.get());
  auto kernel = kernel_holders(hr, res.file.st, reporter.holders_at_start());
  Incident inc;
  inc.at = sys::utc_now_iso8601();
  inc.lock_id = lock_id;
  inc.policy = std::string(policy_name(o.policy));
  inc.deadline_ms = plan.deadline_ns / 1'000'000;
  inc.waited_ms = res.waited_ns / 1'000'000;
  inc.holder = hr.record;
  if (hr.record) inc.holder_alive = holder_process_alive(*hr.record);
  for (const auto& k : kernel) inc.holder_pids.push_back(k.pid);
  inc.waiter_pid = ctx.pid;
  inc.waiter_agent = o.agent;
  inc.waiter_operation = o.operation;
  inc.operator_action = operator_action(o.policy);

  // The timeout is the result; the incident row is its audit trail, so it is
  // appended first (one write) and a failure only adds a warning.
  int err = append_incident(dir.fd.get(), encode_incident(inc));
  log.error("lock_acquire_timeout",
            "lock_acquire_timeout: " + lock_display(o.dir) + " still held after " + seconds_text(res.waited_ns) +
                " by " + describe_holder(hr, kernel) + "; gave up " + o.operation + " (policy " + inc.policy + ")",
            "Run 'looplock --inspect " + o.dir + "' to see the holder; never delete the lock file.",
            {{"lock_id", lock_id}, {"policy", inc.policy}, {"waited_ms", inc.waited_ms},
             {"deadline_ms", inc.deadline_ms}, {"holder_pids", inc.holder_pids},
             {"holder", inc.holder ? holder_to_json(*inc.holder) : Json(nullptr)}});
  warn_if_not_appended(err, o, log);
}


std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// The cluster lock's name: --lock-name, else the loop dir's base name.
std::string cluster_lock_name(const Options& o, const std::string& canonical_dir) {
  if (!o.lock_name.empty()) return o.lock_name;
  auto slash = canonical_dir.rfind('/');
  std::string base = slash == std::string::npos ? canonical_dir : canonical_dir.substr(slash + 1);
  if (!valid_lock_name(base)) {
    throw Fatal(exit_code::kUsage, "the loop directory's base name cannot name a cluster lock",
                "Give one with --lock-name NAME.");
  }
  return base;
}

Incident cluster_incident(const Options& o, const Context& ctx, const std::string& lock_id, const ClusterLock& c,
                          const std::optional<Json>& holder) {
  Incident inc;
  inc.at = sys::utc_now_iso8601();
  inc.lock_id = lock_id;
  inc.policy = std::string(policy_name(o.policy));
  inc.waiter_pid = ctx.pid;
  inc.waiter_agent = o.agent;
  inc.waiter_operation = o.operation;
  inc.cluster = Json{{"lock_name", c.name()}, {"endpoint", c.endpoint()}, {"holder", holder ? *holder : Json(nullptr)}};
  return inc;
}

void report_cluster_timeout(const Options& o, const Context& ctx, const LockDir& dir, const ClusterLock& c,
                            const WaitPlan& plan, const std::string& lock_id, const Logger& log) {
  Incident inc = cluster_incident(o, ctx, lock_id, c, c.blocker());
  inc.deadline_ms = plan.deadline_ns / 1'000'000;
  inc.waited_ms = (sys::monotonic_ns() - ctx.start_ns) / 1'000'000;
  inc.operator_action = operator_action(o.policy) +
                        "; the lock is held on another host (cluster lock " + c.name() +
                        "): inspect it with 'looplock --inspect --etcd ENDPOINTS DIR' on any host.";
  int err = append_incident(dir.fd.get(), encode_incident(inc));
  log.error("lock_acquire_timeout",
            "lock_acquire_timeout: cluster lock " + printable(c.name()) + " (etcd) still held after " +
                seconds_text(inc.waited_ms * 1'000'000) + " by " + describe_cluster_holder(c.blocker()) + "; gave up " +
                o.operation + " (policy " + inc.policy + ")",
            "Run 'looplock --inspect --etcd ENDPOINTS " + o.dir + "' to see the holder.",
            {{"lock_id", lock_id}, {"policy", inc.policy}, {"waited_ms", inc.waited_ms},
             {"deadline_ms", inc.deadline_ms}, {"cluster", inc.cluster}});
  warn_if_not_appended(err, o, log);
}

void report_lease_lost(const Options& o, const Context& ctx, const LockDir& dir, const ClusterLock& c,
                       const std::optional<HolderRecord>& record, const std::string& lock_id, const Logger& log) {
  Incident inc = cluster_incident(o, ctx, lock_id, c, std::nullopt);
  inc.error_code = "lease_lost";
  inc.deadline_ms = static_cast<long long>(c.ttl_s()) * 1000;
  inc.waited_ms = c.since_last_keepalive_ns() / 1'000'000;
  inc.holder = record;
  if (record) inc.holder_alive = true;
  inc.holder_pids = {ctx.pid};
  inc.cluster["fencing_token"] = c.fencing_token();
  inc.cluster["lease"] = etcd::lease_hex(c.lease());
  inc.cluster["why"] = c.lost_why();
  inc.operator_action =
      "The etcd lease was lost while the command ran (" + c.lost_why() +
      "), so another host may have taken the lock: the command was terminated. Check etcd's health and the network "
      "between this host and etcd; make writers check LOOPLOCK_FENCING_TOKEN so a stale holder is refused.";
  int err = append_incident(dir.fd.get(), encode_incident(inc));
  log.error("lease_lost",
            "lease_lost: the etcd lease of cluster lock " + printable(c.name()) + " was lost while " + o.operation +
                " ran: " + printable(c.lost_why()) + "; terminating the command",
            "Another host may hold the lock now. Check etcd (" + c.endpoint() + ") and the network.",
            {{"lock_id", lock_id}, {"cluster", inc.cluster}});
  warn_if_not_appended(err, o, log);
}

}  // namespace

Outcome run(const Options& o, const Context& ctx, const Logger& log) {
  if (o.mode == Mode::Inspect) return exit_status(inspect(o, log, ctx.etcd));

  const InheritedSignals inherited = take_signal_control();
  LockDir dir = open_lock_dir(o.dir);
  if (auto fs = network_file_system(dir.fd.get())) {
    log.warn("network_file_system", o.dir + " is on a network file system (" + *fs +
                                        "): flock(2) there may not exclude processes on other hosts; looplock "
                                        "supports local file systems only");
  }
  const std::string canonical = canonical_lock_path(dir.fd.get(), o.dir);
  const std::string canonical_dir = canonical.substr(0, canonical.size() - std::string_view(kLockName).size() - 1);
  const std::string lock_id = lock_id_for_path(canonical);
  const LockMode mode = o.shared ? LockMode::Shared : LockMode::Exclusive;

  // Nested inside a looplock that already holds this lock: run at once.
  if (env_get(ctx.env, env_name::kHolderPid)) {
    LockFile probe = open_lock_file(dir);
    if (auto outer = find_outer_holder(ctx.env, probe.st, mode == LockMode::Exclusive, ctx.pid)) {
      log.verbose("nested", "already held by looplock pid " + std::to_string(outer->pid) +
                                " (an ancestor); running inside its critical section");
      CommandSpec spec{.argv = o.command, .env = ctx.env, .pass_fd = -1, .kill_after_ns = o.kill_after_ns,
                   .tick = {}};
      if (o.close_fd) {
        // -o holds inside a nested run too: the command gets no lock fd.
        if (auto fd = inherited_lock_fd(ctx.env, probe.st)) fcntl(*fd, F_SETFD, FD_CLOEXEC);
        spec.env = env_with(ctx.env, {}, {env_name::kFd});
      }
      probe.fd.reset();
      if (o.no_fork) exec_command(spec, inherited);
      return finish(run_command(spec, inherited, log));
    }
  }

  const WaitPlan plan = wait_plan(o.policy, o.timeout_ns);

  // The cluster lock first, the local one second, always in that order (so
  // that two hosts never wait for each other crosswise); the deadline counts
  // from looplock's start and covers both.
  std::optional<ClusterLock> cluster;
  if (!o.etcd.empty()) {
    cluster.emplace(*ctx.etcd, etcd::parse_endpoints(o.etcd).endpoints, cluster_lock_name(o, canonical_dir), o.ttl_s,
                    o.lease_kill_after_ns, log, cluster_access(o, log));
    auto got = cluster->acquire(plan, ctx.start_ns, ClusterHolder{host_name(), ctx.pid, o.agent, o.operation, {}, {}, 0});
    if (got == ClusterLock::Outcome::Busy) {
      log.result("noop-locked",
                 "noop-locked: cluster lock " + printable(cluster->name()) + " (etcd) is held by " +
                     describe_cluster_holder(cluster->blocker()) + "; skipped " + o.operation + " (policy single_flight)",
                 {{"lock_id", lock_id}, {"policy", policy_name(o.policy)}, {"lock_name", cluster->name()}});
      return exit_status(o.skip_exit_code);
    }
    if (got == ClusterLock::Outcome::TimedOut) {
      report_cluster_timeout(o, ctx, dir, *cluster, plan, lock_id, log);
      return exit_status(o.conflict_exit_code);
    }
    log.verbose("acquired", "cluster lock " + printable(cluster->name()) + " acquired on etcd after " +
                                seconds_text(sys::monotonic_ns() - ctx.start_ns) + " (fencing token " +
                                std::to_string(cluster->fencing_token()) + ")",
                {{"lock_name", cluster->name()}, {"fencing_token", cluster->fencing_token()}});
  }

  // Work that does not need the lock is done before waiting for it.
  EnvList env = command_env(ctx, o, canonical_dir, lock_id, cluster ? &*cluster : nullptr);
  const std::string pid_start = mode == LockMode::Exclusive ? procfs::pid_start(ctx.pid).value_or("") : "";

  WaitReporter reporter(o, log, plan.kind == WaitPlan::Kind::Bounded);
  AcquireResult res = acquire_lock(dir, plan, mode, reporter, ctx.start_ns);

  if (res.status == AcquireResult::Status::Busy) {
    HolderRead hr = read_holder(res.file.fd.get());
    log.result("noop-locked",
               "noop-locked: " + lock_display(o.dir) + " is held by " +
                   describe_holder(hr, kernel_holders(hr, res.file.st)) + "; skipped " + o.operation +
                   " (policy single_flight)",
               {{"lock_id", lock_id}, {"policy", policy_name(o.policy)}});
    return exit_status(o.skip_exit_code);
  }
  if (res.status == AcquireResult::Status::TimedOut) {
    report_timeout(o, ctx, dir, res, plan, lock_id, reporter, log);
    return exit_status(o.conflict_exit_code);
  }

  LockFile& file = res.file;
  log.verbose("acquired", std::string(mode == LockMode::Shared ? "shared" : "exclusive") + " lock on " +
                              lock_display(o.dir) + " acquired after " + seconds_text(res.waited_ns),
              {{"lock_id", lock_id}, {"waited_ms", res.waited_ns / 1'000'000}});

  std::optional<HolderRecord> record;
  if (mode == LockMode::Exclusive) {
    if (file.read_only) {
      log.warn("read_only_lock_file", lock_display(o.dir) +
                                          " is read-only for looplock: the lock is held, but no holder record can be written");
    } else {
      record = HolderRecord{lock_id, ctx.pid, pid_start, o.agent, o.operation,
                            std::string(policy_name(o.policy)), sys::utc_now_iso8601(), std::nullopt};
      if (!write_holder(file.fd.get(), *record)) {
        log.warn("holder_write_failed", errno_message("cannot write the holder record into " + lock_display(o.dir), errno));
        record.reset();
      }
    }
  }

  add_lock_fd(env, file.fd.get(), !o.close_fd);
  CommandSpec spec{.argv = o.command,
                   .env = std::move(env),
                   .pass_fd = o.close_fd ? -1 : file.fd.get(),
                   .kill_after_ns = o.kill_after_ns,
                   .tick = {}};
  if (cluster) {
    // Until the job loop wakes for the lease's own deadlines: polled, so that
    // TERM goes out by term_by (+ one poll) and KILL kill-after later.
    spec.tick = [&] {
      if (cluster->poll_lease()) return true;
      report_lease_lost(o, ctx, dir, *cluster, record, lock_id, log);
      return false;
    };
    spec.tick_interval_ns = cluster->poll_interval_ns();
    spec.tick_kill_after_ns = cluster->kill_after_ns();
  }
  int status;
  try {
    if (o.no_fork) exec_command(spec, inherited);
    status = run_command(spec, inherited, log);
  } catch (const Fatal&) {
    if (record) {
      record->released_at = sys::utc_now_iso8601();
      (void)write_holder(file.fd.get(), *record);
    }
    throw;
  }

  // The command has ended; looplock still holds the lock. Was it protecting
  // the real file all along?
  const bool intact = lock_path_intact(dir, file) && dir_intact(dir);
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
    auto leaked = procfs::pids_holding_flock(procfs::descendants(ctx.pid), file.st);
    if (!leaked.empty()) {
      std::string pids;
      for (pid_t p : leaked) pids += (pids.empty() ? "" : ", ") + std::to_string(p);
      log.warn("lock_leaked", "the command exited, but pid " + pids + " that it started still holds " +
                                  lock_display(o.dir) + " through the inherited lock fd; the lock stays held until "
                                  "it exits. Use -o/--close for commands that start background processes",
               {{"pids", leaked}});
    }
  }

  log.verbose("released", "released " + lock_display(o.dir) + "; the command " +
                              (WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                                   : "exited with " + std::to_string(shell_status(status))));
  if (cluster) {
    cluster->release();  // after the local lock, as promised
    log.verbose("released", "released cluster lock " + printable(cluster->name()) + " on etcd");
    if (cluster->lost()) return exit_status(exit_code::kLeaseLost);
  }
  if (!intact) {
    const bool command_failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    log.error("loop_dir_vanished",
              "loop dir vanished mid-lock: " + lock_display(o.dir) +
                  " was deleted or replaced while the command ran, so the lock no longer protected it",
              command_failed ? "The command failed too; looplock exits with its status."
                             : "Check what removed it; never delete the lock file or the loop directory of a running loop.");
    if (!command_failed) return exit_status(exit_code::kVanished);
  }
  return finish(status);
}

int main_program(int argc, char** argv, char** envp, etcd::Transport* etcd) {
  const long long now_ns = sys::monotonic_ns();
  std::vector<std::string> args(argv, argv + argc);
  Context ctx{env_from(envp), getpid(), now_ns, etcd};
  // looplock-etcd: the deadline counts from when looplock started.
  if (auto handed = take_handed_start(ctx.env, now_ns); handed && etcd) ctx.start_ns = *handed;
  // Until the options are known, errors are plain text.
  Logger log(Verbosity::Normal, LogFormat::Text);
  try {
    Environment penv{env_get(ctx.env, env_name::kAgent), env_get(ctx.env, env_name::kEtcd), user_name,
                     env_get(ctx.env, env_name::kEtcdCacert), env_get(ctx.env, env_name::kEtcdClientCert),
                     env_get(ctx.env, env_name::kEtcdClientKey), env_get(ctx.env, env_name::kEtcdPassword)};
    Options o = parse_options(args, penv);
    if (o.mode == Mode::Help) {
      return sys::write_all(1, help_text()) ? 0 : exit_code::kOsError;
    }
    if (o.mode == Mode::Version) {
      return sys::write_all(1, version_text()) ? 0 : exit_code::kOsError;
    }
    log = Logger(o.verbosity, o.log_format);
    if (!o.etcd.empty() && !ctx.etcd) exec_cluster_helper(argv, ctx.env, ctx.start_ns);
    Outcome out = run(o, ctx, log);
    if (out.kind == Outcome::Kind::LikeWaitStatus) exit_like(out.value);
    return out.value;
  } catch (const Fatal& e) {
    log.error("error", e.what(), e.hint());
    return e.status();
  } catch (const std::bad_alloc&) {
    log.error("error", "out of memory");
    return exit_code::kOsError;
  } catch (const std::exception& e) {
    log.error("error", std::string("internal error: ") + e.what());
    return exit_code::kOsError;
  }
}

}  // namespace looplock
