#include "cli/app.hpp"

#include <array>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "cli/cluster_exec.hpp"
#include "cli/hold.hpp"
#include "cli/info_commands.hpp"
#include "cli/inspect.hpp"
#include "cli/release.hpp"
#include "cli/run_command.hpp"
#include "cli/session.hpp"
#include "os/sys.hpp"

namespace looplock {

namespace {

int inspect_command(Session& s) { return inspect(s.options, s.log, s.ctx.cluster); }
int release_command(Session& s) { return release_hold(s.options, s.log); }

// Each mode's command, and whether it takes the cluster lock (or reads it):
// then, in looplock without it, --etcd hands the command line to
// looplock-etcd (--release needs no etcd: the holder revokes its own lease).
struct CommandRow {
  Mode mode;
  Command command;
  bool uses_cluster;
};
constexpr std::array kCommands = {
    CommandRow{Mode::Help, help_command, false},
    CommandRow{Mode::Version, version_command, false},
    CommandRow{Mode::Completions, completions_command, false},
    CommandRow{Mode::Inspect, inspect_command, true},
    CommandRow{Mode::Release, release_command, false},
    CommandRow{Mode::Hold, hold_command, true},
    CommandRow{Mode::Run, run_command, true},
};

// The process's facts and its environment as the parser reads it.
Context context_of(char** envp, Instant now, long long start_wall_ms, LockKind* cluster) {
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
  return ctx;
}

Environment parser_environment(const Context& ctx) {
  // The user name (getuid(2) and a read of /etc/passwd) only when no
  // --agent or $LOOPLOCK_AGENT names the agent: the holder record's agent_id.
  return Environment{.looplock_agent = env_get(ctx.env, env_name::kAgent),
                     .looplock_etcd = env_get(ctx.env, env_name::kEtcd),
                     .metrics_dir = env_get(ctx.env, env_name::kMetricsDir),
                     .user_name = [] { return sys::user_name(sys::own_uid()); },
                     .looplock_etcd_cacert = env_get(ctx.env, env_name::kEtcdCacert),
                     .looplock_etcd_client_cert = env_get(ctx.env, env_name::kEtcdClientCert),
                     .looplock_etcd_client_key = env_get(ctx.env, env_name::kEtcdClientKey),
                     .looplock_etcd_password = env_get(ctx.env, env_name::kEtcdPassword),
                     .looplock_hold = env_get(ctx.env, env_name::kHold)};
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
    Context ctx = context_of(envp, now, start_wall_ms, cluster);
    Options& o = options.emplace(parse_options(std::vector<std::string>(argv, argv + argc), parser_environment(ctx)));
    const CommandRow* row = nullptr;
    for (const auto& r : kCommands) {
      if (r.mode == o.mode) row = &r;
    }
    if (!row) throw Fatal(exit_code::kOsError, "internal error: no command for the mode parsed");
    log = Logger(o.output.verbosity, o.output.log_format);
    if (row->uses_cluster && !o.cluster.etcd.empty() && !ctx.cluster) exec_cluster_helper(argv, ctx.env, ctx.start);
    Session s{.argv = argv, .ctx = ctx, .options = o, .log = log, .notifier = notifier, .facts = facts,
              .start_wall_ms = start_wall_ms};
    return row->command(s);
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
