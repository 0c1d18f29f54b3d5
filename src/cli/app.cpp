#include "cli/app.hpp"

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "cli/cluster_exec.hpp"
#include "cli/completions.hpp"
#include "cli/hold.hpp"
#include "cli/inspect.hpp"
#include "cli/release.hpp"
#include "cli/version.hpp"
#include "job/process_jobs.hpp"
#include "os/sys.hpp"
#include "run/notify.hpp"

namespace looplock {

namespace {

// --metrics-dir: after every run that got as far as knowing its lock. A file
// that cannot be written is one warning: never another exit status.
void write_metrics(const Options& o, const RunFacts& facts, int status, long long start_wall_ms, const Logger& log) {
  if (o.metrics_dir.empty() || facts.lock_id.empty() || (o.mode != Mode::Run && o.mode != Mode::Hold)) return;
  RunMetrics m;
  m.lock_id = facts.lock_id;
  m.loop = facts.loop;
  m.operation = o.identity.operation;
  m.outcome = facts.outcome.value_or(RunOutcome::Error);
  m.exit_status = status;
  m.start_s = static_cast<double>(start_wall_ms) / 1000.0;
  m.end_s = static_cast<double>(sys::realtime_ms()) / 1000.0;
  m.wait_s = std::chrono::duration<double>(facts.waited).count();
  m.duration_s = std::chrono::duration<double>(facts.ran).count();
  if (const auto f = update_metrics_file(o.metrics_dir, m)) {
    log.warn("metrics_write_failed",
             "cannot update the metrics: " + failure_message(*f) + (f->hint.empty() ? "" : " (" + f->hint + ")"));
  }
}

// A run that ended in an error: said, then --notify's ended (the command
// could not run, a lock file refused, ...: after the error, as the run's
// last) and the metrics.
int ended_in_error(const Fatal& e, const Logger& log, const Options* o, bool notifying, const RunFacts& facts,
                   long long start_wall_ms) {
  log.error(e.event(), e.what(), e.hint());
  if (notifying && o) say_ended(log, o->identity.operation, RunOutcome::Error, e.status(), facts.ran);
  if (o) write_metrics(*o, facts, e.status(), start_wall_ms, log);
  // An ending signal a coalescing waiter's seat held back, that came before
  // the error: once the error is said, looplock ends of it, as it would have.
  if (facts.seat_signal_held && sys::pending_ending_signal() != 0) sys::let_ending_signals_through();
  return e.status();
}

}  // namespace

int main_program(int argc, char** argv, char** envp, LockKind* cluster) {
  // A hold's sentinel (cli/hold.hpp): looplock's own command, no run.
  if (const auto sentinel = sentinel_main(argc, argv)) return *sentinel;
  const Instant now = MonotonicClock::now();
  const long long start_wall_ms = sys::realtime_ms();
  // Until the options are parsed, errors use the --log-format asked for, if
  // it can be told: with json, a usage error is a JSON line too.
  Logger log(Verbosity::Normal, requested_log_format(argc, argv));
  std::optional<Options> options;
  // --notify's relay: it outlives the try below, so that an error's event
  // reaches it too; it is finished before looplock exits.
  std::optional<Notifier> notifier;
  RunFacts facts;
  try {
    std::vector<std::string> args(argv, argv + argc);
    // Its pid, once: the holder record, the job's signals and the leak check name this pid.
    Context ctx{.env = env_from(envp),
                .pid = sys::own_pid(),
                .start = now,
                .start_wall_ms = start_wall_ms,
                .cluster = cluster,
                .on_held = {}};
    // looplock-etcd: the deadline counts from when looplock started.
    if (auto handed = take_handed_start(ctx.env, now); handed && cluster) {
      ctx.start = *handed;
      ctx.start_wall_ms = start_wall_ms - ms_of(now - *handed);
    }
    // The user name (getuid(2) and a read of /etc/passwd) only when no
    // --agent or $LOOPLOCK_AGENT names the agent: the holder record's agent_id.
    Environment penv{.looplock_agent = env_get(ctx.env, env_name::kAgent),
                     .looplock_etcd = env_get(ctx.env, env_name::kEtcd),
                     .metrics_dir = env_get(ctx.env, env_name::kMetricsDir),
                     .user_name = [] { return sys::user_name(sys::own_uid()); },
                     .looplock_etcd_cacert = env_get(ctx.env, env_name::kEtcdCacert),
                     .looplock_etcd_client_cert = env_get(ctx.env, env_name::kEtcdClientCert),
                     .looplock_etcd_client_key = env_get(ctx.env, env_name::kEtcdClientKey),
                     .looplock_etcd_password = env_get(ctx.env, env_name::kEtcdPassword),
                     .looplock_hold = env_get(ctx.env, env_name::kHold)};
    Options& o = options.emplace(parse_options(args, penv));
    if (o.mode == Mode::Help) {
      write_stdout(help_text());
      return exit_code::kOk;
    }
    if (o.mode == Mode::Completions) {
      write_stdout(*completion_script(o.completions));
      return exit_code::kOk;
    }
    if (o.mode == Mode::Version) {
      const bool helper = ctx.cluster != nullptr;  // this is looplock-etcd
      const std::string etcd_status = helper ? "available, built in (this is looplock-etcd)" : cluster_helper_status();
      write_stdout(version_text(build_info(helper), etcd_status));
      return exit_code::kOk;
    }
    log = Logger(o.output.verbosity, o.output.log_format);
    // (--release needs no etcd: the holder revokes its own lease.)
    if (!o.cluster.etcd.empty() && !ctx.cluster && o.mode != Mode::Release) {
      exec_cluster_helper(argv, ctx.env, ctx.start);
    }
    if (o.mode == Mode::Inspect) return inspect(o, log, ctx.cluster);
    if (o.mode == Mode::Release) return release_hold(o, log);
    // --hold: the caller returns once the holder holds the lock; the holder
    // goes on as a run.
    if (o.mode == Mode::Hold) {
      if (const auto caller = start_hold(o, ctx, log)) return *caller;
    }
    // Before DIR is opened: the relay never holds a lock's descriptor.
    if (!o.notify.command.empty()) log.set_sink(&notifier.emplace(o.notify, ctx.env, log));
    const auto jobs = process_jobs();
    Exit out = Run(o, ctx, log, facts, build_stack, *jobs).run();
    const int status = out.kind == Exit::Kind::LikeWaitStatus ? shell_status(out.value) : out.value;
    write_metrics(o, facts, status, start_wall_ms, log);
    log.set_sink(nullptr);
    if (notifier) notifier->finish();  // exit_like may not return
    if (out.kind == Exit::Kind::LikeWaitStatus) jobs->exit_like(out.value);
    return out.value;
  } catch (const Fatal& e) {
    return ended_in_error(e, log, options ? &*options : nullptr, notifier.has_value(), facts, start_wall_ms);
  } catch (const std::bad_alloc&) {
    // No allocation here: there may be nothing left to allocate.
    (void)sys::write_all(2, log.is_text()
                                ? "looplock: out of memory\n"
                                : "{\"level\":\"error\",\"event\":\"out_of_memory\",\"message\":\"out of memory\"}\n");
    return exit_code::kOsError;
  } catch (const std::exception& e) {
    log.error("internal_error", std::string("internal error: ") + e.what());
    return exit_code::kOsError;
  }
}

}  // namespace looplock
