#include "cli/hold.hpp"

#include <charconv>
#include <cstdlib>
#include <memory>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "job/job.hpp"
#include "os/digest.hpp"
#include "os/hold_process.hpp"
#include "os/process.hpp"
#include "os/sys.hpp"
#include "records/hold.hpp"

namespace looplock {

namespace {

std::optional<long long> number(const char* text) {
  if (!text) return std::nullopt;
  const std::string_view s = text;
  long long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 0 || v > 0x7fffffff) return std::nullopt;
  return v;
}

}  // namespace

// `looplock --hold-sentinel HOLDER HASH [TIED_PID TIED_START]`, the lock's
// descriptor in $LOOPLOCK_FD.
std::optional<int> sentinel_main(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) != kSentinelArg) return std::nullopt;
  if (argc != 4 && argc != 6) return exit_code::kUsage;
  const auto holder = number(argv[2]);
  const auto tied = argc == 6 ? number(argv[4]) : std::optional<long long>(0);
  if (!holder || !tied) return exit_code::kUsage;
  const auto fd = number(std::getenv(std::string(env_name::kFd).c_str()));
  // The cluster lock's facts for the steps' commands, as the holder gave them.
  std::string exports;
  for (const auto name : {env_name::kEtcdKey, env_name::kEtcdLease, env_name::kFencingToken}) {
    if (const char* v = std::getenv(std::string(name).c_str())) exports += "\n" + std::string(name) + "=" + v;
  }
  return sys::hold_sentinel({.holder = static_cast<Pid>(*holder),
                             .lock_fd = fd ? static_cast<int>(*fd) : -1,
                             .secret_sha256 = argv[3],
                             .tied_to = static_cast<Pid>(*tied),
                             .tied_start = argc == 6 ? argv[5] : "",
                             .exports = exports});
}

namespace {

// --hold's status when the --tied-to process ended before the lock was held.
constexpr int kTieEnded = 1;

// The tie, as it is now: --tied-to's process and its start time.
HoldFacts tie_of(Pid tied_to) {
  HoldFacts facts;
  if (tied_to == 0) return facts;
  const std::optional<std::string> start = sys::process_start(tied_to);
  // Pinned as the sentinel will pin it: a thread's id is no process.
  if (!start || !sys::process_alive(tied_to) || !sys::PinnedProcess::pin(tied_to, *start)) {
    throw Fatal(exit_code::kUsage, "--tied-to " + std::to_string(tied_to) + ": there is no such process",
                "Give the pid of a process that lives as long as the hold should: in a GitHub Actions step, "
                "\"$PPID\" (the runner's worker).");
  }
  facts.tied_to = tied_to;
  facts.tied_start = *start;
  return facts;
}

// The holder's options: the sentinel as its command (it holds the lock's
// descriptor, to hand it to later steps), DIR absolute (the holder's working
// directory is /).
void make_holder_options(Options& o, const HoldFacts& facts, Pid holder) {
  const std::optional<std::string> exe = sys::own_executable();
  if (!exe) throw Fatal(exit_code::kOsError, "cannot tell looplock's own executable (/proc/self/exe) for the hold");
  o.command = {*exe, std::string(kSentinelArg), std::to_string(holder), facts.secret_sha256};
  if (facts.tied_to != 0) {
    o.command.push_back(std::to_string(facts.tied_to));
    o.command.push_back(facts.tied_start);
  }
  o.shell_form = false;
  o.lock.close_fd = false;
  o.hold.facts = facts;
}

// DIR made absolute: the holder's working directory is /.
void make_dir_absolute(Options& o) {
  if (o.dir.starts_with('/')) return;
  const std::optional<std::string> cwd = sys::working_dir();
  if (!cwd) fail_errno(exit_code::kOsError, "cannot read the working directory to make DIR absolute", errno);
  o.dir = sys::path_in_dir(*cwd, o.dir);
}

// The caller's end: the line, or the holder's own end.
int caller_end(const sys::HolderReport& report, const Logger& log, Pid holder) {
  if (report.signal != 0) return 128 + report.signal;  // the holder was told to let go
  if (report.line) {
    try {
      write_stdout(std::string(env_name::kHold) + "=" + *report.line + "\n");
    } catch (const Fatal&) {
      // Nobody will know the value: no hold.
      sys::stop_holder(holder);
      throw;
    }
    log.verbose("hold", "held by looplock pid " + std::to_string(holder) +
                            " until looplock --release, --max-time, or the end of the process it is tied to");
    return exit_code::kOk;
  }
  // The holder has said why (its stderr was the caller's until then).
  return shell_status(report.wait_status);
}

}  // namespace

std::optional<int> start_hold(Options& o, Context& ctx, const Logger& log) {
  HoldFacts facts = tie_of(o.hold.tied_to);
  const std::optional<std::string> secret = new_hold_secret();
  if (!secret) fail_errno(exit_code::kOsError, "cannot draw the hold's secret (getrandom)", errno);
  facts.secret_sha256 = sys::sha256_hex(*secret);
  facts.max_time_ms = o.limits.max_time ? ms_of(*o.limits.max_time) : 0;
  make_dir_absolute(o);
  std::optional<sys::Detached> d = sys::detach_holder();
  if (!d) fail_errno(exit_code::kOsError, "cannot start the hold's holder process (fork)", errno);
  if (d->pid != 0) return caller_end(sys::await_holder(d->pid, d->report.get()), log, d->pid);
  // The holder.
  ctx.pid = sys::own_pid();
  make_holder_options(o, facts, ctx.pid);
  auto report = std::make_shared<UniqueFd>(std::move(d->report));
  ctx.on_held = [report, secret = *secret, dir = o.dir, pid = ctx.pid, facts](const EnvList& env) {
    // A tie that ended while the hold waited: the hold would end at once.
    if (facts.tied_to != 0 && sys::process_start(facts.tied_to) != facts.tied_start) {
      throw Fatal(kTieEnded,
                  "the process --tied-to names (pid " + std::to_string(facts.tied_to) +
                      ") ended while the hold waited for the lock; the lock is let go",
                  "", "hold_tie_ended");
    }
    HoldValue v{.pid = pid,
                .start = sys::own_start().value_or(""),
                .secret = secret,
                .lock_id = env_get(env, env_name::kLockId).value_or(""),
                .dir = dir,
                .etcd_key = env_get(env, env_name::kEtcdKey).value_or("")};
    if (!sys::report_held(std::move(*report), format_hold_value(v) + "\n")) {
      fail_errno(exit_code::kOsError, "the looplock --hold that started this holder is gone; the lock is let go",
                 errno);
    }
  };
  return std::nullopt;
}

}  // namespace looplock
