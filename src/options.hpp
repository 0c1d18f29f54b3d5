// The command line: split at "--" (or "-c") so that cxxopts never sees the
// command's arguments, parse looplock's own options, validate them, and
// resolve defaults (agent, operation) into one Options struct that is passed
// down. Errors are Fatal with exit status 64 and a hint.
#pragma once

#include <csignal>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "duration.hpp"
#include "etcd.hpp"
#include "log.hpp"
#include "policy.hpp"

namespace looplock {

enum class Mode { Run, Inspect, Help, Version };

struct Options {
  Mode mode = Mode::Run;
  std::string dir;                // the loop directory (the first one, for --inspect)
  std::vector<std::string> dirs;  // --inspect: every DIR given, in order
  // The argv to execute. For -c this is {"/bin/sh", "-c", "--", STRING}.
  std::vector<std::string> command;
  bool shell_form = false;

  Policy policy = Policy::Mutation;
  std::optional<long long> timeout_ns;     // -w
  int conflict_exit_code = 75;             // -E
  int skip_exit_code = 0;                  // --skip-exit-code
  bool shared = false;                     // -s
  bool close_fd = false;                   // -o
  bool no_fork = false;                    // -F
  std::optional<long long> kill_after_ns;  // --kill-after as given (0 and kForever: never)
  // Resolved from it: KILL this long after a TERM or INT looplock forwarded
  // (nullopt: never, as timeout(1)); and after --max-time's TERM (--kill-after
  // as above, or kDefaultKillAfterNs when it was not given).
  std::optional<long long> signal_kill_after_ns;
  std::optional<long long> max_time_kill_after_ns;
  std::optional<long long> max_time_ns;  // --max-time (nullopt: no limit)
  std::optional<long long> warn_before_ns;  // --warn-before
  int warn_signal = SIGUSR1;                // --warn-signal
  std::optional<long long> once_per_ns;     // --once-per
  std::optional<long long> jitter_ns;       // --jitter
  std::string metrics_dir;               // --metrics-dir or $LOOPLOCK_METRICS_DIR; empty: none

  std::string agent;      // resolved: --agent, $LOOPLOCK_AGENT, user name
  std::string operation;  // resolved: --operation or derived from the command

  Verbosity verbosity = Verbosity::Normal;
  LogFormat log_format = LogFormat::Text;

  // Cluster (--etcd): a lock on etcd taken before the local one.
  std::string etcd;                       // the endpoints as given; empty: no cluster lock
  std::vector<etcd::Endpoint> endpoints;  // parsed
  std::string lock_name;                  // --lock-name; empty: the loop dir's base name
  int ttl_s = 10;                         // --ttl: the lease's time to live
  // The kill-after of the lease's deadlines (lease_kill_after_ns()): --kill-after,
  // or a default that fits the TTL.
  long long lease_kill_after_ns = 0;
  // TLS and authentication (https:// endpoints, an etcd user).
  std::string etcd_cacert;                   // --etcd-cacert, $LOOPLOCK_ETCD_CACERT
  std::string etcd_cert;                     // --etcd-cert, $LOOPLOCK_ETCD_CLIENT_CERT
  std::string etcd_key;                      // --etcd-key, $LOOPLOCK_ETCD_CLIENT_KEY
  std::string etcd_user;                     // --etcd-user
  std::string etcd_password_file;            // --etcd-password-file (read when the lock is taken)
  std::optional<std::string> etcd_password;  // $LOOPLOCK_ETCD_PASSWORD, with --etcd-user; never printed

  // --inspect
  bool json = false;
  bool check = false;  // --check: exit 1 when a report warns
  long long stale_after_ns = 2LL * 3600 * 1'000'000'000LL;
  size_t incidents = 1;  // --incidents: the newest rows --inspect shows
};

// What parse_options needs from the process environment, so that parsing is
// a pure function (and unit-testable).
struct Environment {
  std::optional<std::string> looplock_agent;  // $LOOPLOCK_AGENT
  std::optional<std::string> looplock_etcd;   // $LOOPLOCK_ETCD: default of --etcd
  std::optional<std::string> metrics_dir;     // $LOOPLOCK_METRICS_DIR: default of --metrics-dir
  std::function<std::string()> user_name;     // from the password database, asked only when needed
  // The cluster lock's TLS files and password (defaults of --etcd-cacert,
  // --etcd-cert, --etcd-key; the password of --etcd-user).
  std::optional<std::string> looplock_etcd_cacert;       // $LOOPLOCK_ETCD_CACERT
  std::optional<std::string> looplock_etcd_client_cert;  // $LOOPLOCK_ETCD_CLIENT_CERT
  std::optional<std::string> looplock_etcd_client_key;   // $LOOPLOCK_ETCD_CLIENT_KEY
  std::optional<std::string> looplock_etcd_password;     // $LOOPLOCK_ETCD_PASSWORD
};

// Only the options argv names are declared to cxxopts (options.cpp says
// why); `declare_all` declares the whole table, which must give the same
// result (the unit tests compare the two).
Options parse_options(const std::vector<std::string>& argv, const Environment& env, bool declare_all = false);

// The --log-format on a command line that may not parse (so that its usage
// error is written in that format): looked for before "--" or "-c" only.
LogFormat requested_log_format(int argc, char** argv);

// The KILL after --max-time's TERM when --kill-after is not given.
inline constexpr long long kDefaultKillAfterNs = 5'000'000'000LL;
inline constexpr size_t kMaxIncidentsShown = 1000;  // --incidents' bound
// --once-per compares operation names whole, and records them so: at most
// this many bytes (records keep 256 bytes of a name).
inline constexpr size_t kMaxOncePerName = 256;
inline constexpr long long kMaxJitterNs = 86'400'000'000'000LL;  // --jitter's bound: 24h

// The default operation name for a command: its base name, or the script's
// base name when the command is an interpreter followed by a script. Never an
// absolute path and never any other argument.
std::string derive_operation(const std::vector<std::string>& command);

// A cluster lock name: 1 to 255 bytes without control characters.
bool valid_lock_name(std::string_view name);

// The kill-after of the etcd lease's deadlines for --ttl `ttl_s`: the given
// --kill-after (`given_text` as typed, for the message), or by default a
// sixth of the TTL, at most 5 s. Throws Fatal 64 for 0 (a lease holder must
// be killable before its lease expires) and for a value that leaves no room
// to renew the lease inside the TTL (lease.hpp).
long long lease_kill_after_ns(std::optional<long long> given, int ttl_s, std::string_view given_text = {});

const std::string& help_text();

}  // namespace looplock
