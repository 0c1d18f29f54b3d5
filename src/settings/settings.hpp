// What a run or --inspect was asked to do, once the command line is parsed
// (options.hpp): the Options struct the layers below the command line read,
// and the bounds and checks of its values that they share.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/hold_facts.hpp"
#include "base/log.hpp"
#include "base/policy.hpp"
#include "job/job_limits.hpp"
#include "settings/endpoints.hpp"

namespace looplock {

enum class Mode { Run, Hold, Release, Inspect, Help, Version, Completions };

// The cluster lock's settings: --etcd and its options, what src/cluster/
// reads (a lock on etcd taken before the local one).
struct ClusterSettings {
  std::string etcd;                       // the endpoints as given; empty: no cluster lock
  std::vector<etcd::Endpoint> endpoints;  // parsed
  std::string lock_name;                  // --lock-name; empty: the loop dir's base name
  int ttl_s = 10;                         // --ttl: the lease's time to live, in seconds as etcd counts it
  // The kill-after of the lease's deadlines (cli/options.hpp's
  // lease_kill_after()): --kill-after, or a default that fits the TTL.
  Duration lease_kill_after{0};
  // TLS and authentication (https:// endpoints, an etcd user).
  std::string etcd_cacert;                   // --etcd-cacert, $LOOPLOCK_ETCD_CACERT
  std::string etcd_cert;                     // --etcd-cert, $LOOPLOCK_ETCD_CLIENT_CERT
  std::string etcd_key;                      // --etcd-key, $LOOPLOCK_ETCD_CLIENT_KEY
  std::string etcd_user;                     // --etcd-user
  std::string etcd_password_file;            // --etcd-password-file (read when the lock is taken)
  std::optional<std::string> etcd_password;  // $LOOPLOCK_ETCD_PASSWORD, with --etcd-user; never printed
};

// How a run waits for its lock, and what it exits with when it does not
// get it (base/policy.hpp's plan is made from these).
struct WaitSettings {
  Policy policy = Policy::Mutation;
  std::optional<Duration> timeout;      // -w
  int conflict_exit_code = 75;          // -E
  int skip_exit_code = 0;               // --skip-exit-code
};

// How looplock speaks: what the Logger is made with (base/log.hpp).
struct OutputSettings {
  Verbosity verbosity = Verbosity::Normal;
  LogFormat log_format = LogFormat::Text;
};

// --notify: a command that hears the run's events (run/notify.hpp).
struct NotifySettings {
  std::string command;                          // empty: no --notify
  std::vector<std::string> on;                  // --notify-on's event names; empty: the default set
  Duration timeout = std::chrono::seconds(10);  // --notify-timeout: each notifier's
  std::optional<Duration> after;                // --notify-after: held_too_long once the job has run this long
};

// What --inspect was asked for.
struct InspectSettings {
  std::vector<std::string> dirs;  // every DIR given, in order
  bool json = false;
  bool check = false;  // --check: exit 1 when a report warns
  Duration stale_after = std::chrono::hours(2);
  size_t incidents = 1;  // --incidents: the newest rows --inspect shows
};

// A hold across steps: --hold's tie, and what --release ends.
struct HoldSettings {
  Pid tied_to = 0;            // --tied-to; 0: none
  std::string release_value;  // --release VALUE, or $LOOPLOCK_HOLD
  bool force = false;         // --release --force DIR
  // The holder's facts for its record, set by the holder process once it
  // has detached (cli/hold.hpp).
  std::optional<HoldFacts> facts;
};

// Who runs what: the holder record's, the incident rows', the ledger's.
struct Identity {
  std::string agent;      // resolved: --agent, $LOOPLOCK_AGENT, user name
  std::string operation;  // resolved: --operation or derived from the command
};

// flock(1)'s own flags, for the local lock and its holder record.
struct LockFlags {
  bool shared = false;    // -s
  bool close_fd = false;  // -o
  bool no_fork = false;   // -F
  // --holders N: up to N runs hold the lock at once (0: one, exclusively).
  int holders = 0;
};

// Running once per schedule slot (src/run/once_per.hpp), and the random
// wait before the lock that spreads a fleet's schedule.
struct OncePerSettings {
  std::optional<Duration> period;  // --once-per; none: every run runs
  std::optional<Duration> jitter;  // --jitter
};

// The whole request, grouped by concern: each part goes to the module that
// reads it (the wait to the policy's plan, the job's limits to the job, the
// lock's flags to the local lock, --once-per's to its module, the cluster
// settings to src/cluster/, the output settings to the Logger, --inspect's
// to the inspection).
struct Options {
  Mode mode = Mode::Run;
  std::string dir;  // the loop directory (the first one, for --inspect)
  // The argv to execute. For -c, sys::shell_argv(STRING) (os/job_control.hpp).
  std::vector<std::string> command;
  bool shell_form = false;

  Identity identity;         // --agent, --operation
  WaitSettings wait;         // -p, -w, -E, --skip-exit-code
  LockFlags lock;            // -s, -o, -F
  JobLimits limits;          // --kill-after, --max-time, --warn-before: resolved (job/job_limits.hpp)
  OncePerSettings once_per;  // --once-per, --jitter
  std::string metrics_dir;   // --metrics-dir or $LOOPLOCK_METRICS_DIR; empty: none
  OutputSettings output;     // -q, -v, --log-format: the Logger's
  NotifySettings notify;     // --notify and its options
  ClusterSettings cluster;   // --etcd and its options
  InspectSettings inspect;   // --inspect's
  HoldSettings hold;         // --hold, --tied-to, --release, --force
  std::string completions;   // --completions SHELL
};

// What each lock of a run is asked for, whatever its kind (lock/lock.hpp),
// made once from the Options (lock_request()): the loop dir as given, who
// runs what, the wait's policy, flock(1)'s flags, and whether the run keeps
// a ledger (--once-per).
struct LockRequest {
  std::string dir;
  Identity identity;
  Policy policy = Policy::Mutation;
  LockFlags flags;
  bool once_per = false;
  int conflict_exit_code = 75;  // -E: also a nested run's that would wait for its own holder
  std::optional<HoldFacts> hold;  // --hold's holder: its record says so
  long long start_wall_ms = 0;    // when this looplock started (wall clock, ms): an absorbed run's start
};
LockRequest lock_request(const Options& o, long long start_wall_ms = 0);

inline constexpr size_t kMaxIncidentsShown = 1000;  // --incidents' bound
// --once-per compares operation names whole, and records them so: at most
// this many bytes (records keep 256 bytes of a name).
inline constexpr size_t kMaxOncePerName = 256;
// --ttl's bounds.
inline constexpr std::chrono::seconds kMinTtl{2};
inline constexpr std::chrono::seconds kMaxTtl{86400};
// --holders' bounds.
inline constexpr int kMinHolders = 2;
inline constexpr int kMaxHolders = 1024;
inline constexpr Duration kMaxJitter = std::chrono::hours(24);  // --jitter's bound
inline constexpr Duration kMinHoldTime = std::chrono::seconds(1);  // --hold's --max-time, at least

// A cluster lock name: 1 to 255 bytes without control characters.
bool valid_lock_name(std::string_view name);

}  // namespace looplock
