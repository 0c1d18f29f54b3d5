#include "cli/hold.hpp"

#include <charconv>
#include <climits>
#include <cstdlib>
#include <memory>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
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

// `looplock --hold-sentinel REPORT_FD [TIED_PID TIED_START]`: the hold's
// value in $LOOPLOCK_HOLD, the lock's descriptor in $LOOPLOCK_FD (never on
// the command line, which every user can read).
std::optional<int> sentinel_main(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) != kSentinelArg) return std::nullopt;
  if (argc != 3 && argc != 5) return exit_code::kUsage;
  const auto report_fd = number(argv[2]);
  const auto tied = argc == 5 ? number(argv[3]) : std::optional<long long>(0);
  const char* value_text = std::getenv(std::string(env_name::kHold).c_str());
  const std::optional<HoldValue> v = value_text ? parse_hold_value(value_text) : std::nullopt;
  if (!report_fd || !tied || !v) return exit_code::kUsage;
  const auto fd = number(std::getenv(std::string(env_name::kFd).c_str()));
  // The cluster lock's facts for the steps' commands, as the holder gave them.
  std::string exports;
  for (const auto name : {env_name::kEtcdKey, env_name::kEtcdLease, env_name::kFencingToken}) {
    if (const char* e = std::getenv(std::string(name).c_str())) exports += "\n" + std::string(name) + "=" + e;
  }
  return sys::hold_sentinel({.holder = v->pid,
                             .lock_fd = fd ? static_cast<int>(*fd) : -1,
                             .report_fd = static_cast<int>(*report_fd),
                             .report_line = value_text,
                             .secret_sha256 = sys::sha256_hex(v->secret),
                             .socket_key = sys::hold_socket_key(v->secret),
                             .tied_to = static_cast<Pid>(*tied),
                             .tied_start = argc == 5 ? argv[4] : "",
                             .exports = exports});
}

namespace {

// --hold's status when the --tied-to process ended before the lock was held.
constexpr int kTieEnded = 1;

// The tie, as it is now: --tied-to's process and its start time, pinned
// (the caller watches it while the holder waits for the lock).
HoldFacts tie_of(Pid tied_to, std::optional<sys::PinnedProcess>& pinned) {
  HoldFacts facts;
  if (tied_to == 0) return facts;
  const std::optional<std::string> start = sys::process_start(tied_to);
  // Pinned as the sentinel will pin it: a thread's id is no process.
  if (start) pinned = sys::PinnedProcess::pin(tied_to, *start);
  const bool thread = start && !pinned && (errno == EINVAL || errno == ENOENT);  // (by kernel version)
  if (pinned && !sys::process_alive(tied_to)) pinned.reset();                    // a zombie
  if (!pinned) {
    throw Fatal(exit_code::kUsage,
                "--tied-to " + quote(std::to_string(tied_to)) +
                    (thread ? ": that is a thread, not a process" : ": there is no such process"),
                "Give the pid of a process that lives as long as the hold should: in a GitHub Actions step, "
                "\"$PPID\" (the runner's worker).");
  }
  facts.tied_to = tied_to;
  facts.tied_start = *start;
  return facts;
}

// Relative paths the holder reads later made absolute: its working
// directory is /.
void make_paths_absolute(Options& o) {
  const std::optional<std::string> cwd = sys::working_dir();
  for (std::string* path : {&o.dir, &o.metrics_dir, &o.cluster.etcd_cacert, &o.cluster.etcd_cert, &o.cluster.etcd_key,
                            &o.cluster.etcd_password_file}) {
    if (path->empty() || path->starts_with('/')) continue;
    if (!cwd)
      fail_errno(exit_code::kOsError, "cannot read the working directory, which the hold needs for " + *path, errno);
    *path = sys::path_in_dir(*cwd, *path);
  }
#if defined(PATH_MAX) && !defined(_WIN32)
  // A relative DIR opens where its absolute path would not; a hold's cannot.
  if (o.dir.size() >= PATH_MAX) {
    throw Fatal(exit_code::kNoInput,
                "cannot hold loop directory " + o.dir + ": its absolute path is " + std::to_string(o.dir.size()) +
                    " bytes, more than the system opens at once (" + std::to_string(PATH_MAX - 1) + ")",
                "A hold opens DIR by its absolute path (its holder and its steps may run anywhere): move or link "
                "the loop directory to a shorter path, and give that.",
                "dir_path_unusable");
  }
#endif
}

// The holder's options: the sentinel as its command (it holds the lock's
// descriptor, to hand it to later steps, and the report's, to say when it
// listens).
void make_holder_options(Options& o, const HoldFacts& facts, int report_fd) {
  const std::optional<std::string> exe = sys::own_executable();
  if (!exe) throw Fatal(exit_code::kOsError, "cannot tell looplock's own executable (/proc/self/exe) for the hold");
  o.command = {*exe, std::string(kSentinelArg), std::to_string(report_fd)};
  if (facts.tied_to != 0) {
    o.command.push_back(std::to_string(facts.tied_to));
    o.command.push_back(facts.tied_start);
  }
  o.shell_form = false;
  o.lock.close_fd = false;
  o.hold.facts = facts;
}

// The caller's end: the line printed (0), or the holder's own end.
int caller_end(const sys::HolderReport& report, const Logger& log, Pid holder) {
  if (report.signal != 0) return 128 + report.signal;  // the holder was told to let go
  if (report.tie_ended) {
    log.error("hold_tie_ended", "the process --tied-to names ended while the hold waited for the lock: no hold");
    return kTieEnded;
  }
  if (report.deliver_err != 0) {
    // Nobody could know the value: the holder was ended, no hold.
    throw Fatal(exit_code::kOsError, errno_message("cannot write to standard output", report.deliver_err),
                "No hold was kept. Check where standard output goes (a full disk, a closed descriptor).",
                "stdout_write_failed");
  }
  if (report.line) {
    log.verbose("hold", "held by looplock pid " + std::to_string(holder) +
                            " until looplock --release, --max-time, or the end of the process it is tied to");
    return exit_code::kOk;
  }
  // The holder has said why (its stderr was the caller's until then), but
  // for an end after it held the lock (its stderr was /dev/null by then).
  const int status = shell_status(report.wait_status);
  if (status == exit_code::kMaxTime || status == exit_code::kLeaseLost) {
    log.error("hold_ended", std::string("the hold ended before it could be reported: ") +
                                (status == exit_code::kMaxTime ? "--max-time passed" : "its etcd lease was lost"));
  }
  return status;
}

// Prints the line; an errno when it cannot.
int print_value(const std::string& line) {
  const std::string text = std::string(env_name::kHold) + "=" + line + "\n";
  return sys::write_all(1, text) ? 0 : (errno != 0 ? errno : EIO);
}

}  // namespace

std::optional<int> start_hold(Options& o, Context& ctx, const Logger& log) {
  std::optional<sys::PinnedProcess> tie;
  HoldFacts facts = tie_of(o.hold.tied_to, tie);
  const std::optional<std::string> secret = new_hold_secret();
  if (!secret) fail_errno(exit_code::kOsError, "cannot draw the hold's secret (getrandom)", errno);
  facts.secret_sha256 = sys::sha256_hex(*secret);
  facts.max_time_ms = o.limits.max_time ? ms_of(*o.limits.max_time) : 0;
  make_paths_absolute(o);
  std::optional<sys::Detached> d = sys::detach_holder();
  if (!d) fail_errno(exit_code::kOsError, "cannot start the hold's holder process (fork)", errno);
  if (d->pid != 0) {
    return caller_end(sys::await_holder(d->pid, d->report.get(), tie ? tie->handle() : -1, print_value), log, d->pid);
  }
  // The holder. Its copy of the tie's handle went with the caller's other
  // descriptors (detach_holder()): dropped before any descriptor is opened.
  tie.reset();
  ctx.pid = sys::own_pid();
  const int report_fd = d->report.release();  // the sentinel's, from the start on
  make_holder_options(o, facts, report_fd);
  ctx.on_held = [report_fd, secret = *secret, dir = o.dir, pid = ctx.pid, facts](CommandSpec& spec) {
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
                .lock_id = env_get(spec.env, env_name::kLockId).value_or(""),
                .dir = dir,
                .etcd_key = env_get(spec.env, env_name::kEtcdKey).value_or("")};
    // The sentinel reports once it listens for the steps: the value, from
    // its environment (never its command line); the holder itself says
    // nothing more.
    env_set(spec.env, {{env_name::kHold, format_hold_value(v)}});
    spec.also_pass_fd = report_fd;
    if (!sys::quiet_stderr()) fail_errno(exit_code::kOsError, "cannot point the holder's stderr at /dev/null", errno);
  };
  return std::nullopt;
}

}  // namespace looplock
