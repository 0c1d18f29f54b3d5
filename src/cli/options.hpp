// The command line: split at "--" (or "-c") so that cxxopts never sees the
// command's arguments, parse looplock's own options, validate them, and
// resolve defaults (agent, operation) into one Options struct (settings.hpp)
// that is passed down. Errors are Fatal with exit status 64 and a hint.
// Nothing below the command line includes this file.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/log.hpp"
#include "settings/settings.hpp"

namespace looplock {

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
  std::optional<std::string> looplock_hold;              // $LOOPLOCK_HOLD: what --release ends
};

// Only the options argv names are declared to cxxopts (options.cpp says
// why); `declare_all` declares the whole table, which must give the same
// result (the unit tests compare the two).
Options parse_options(const std::vector<std::string>& argv, const Environment& env, bool declare_all = false);

// The --log-format on a command line that may not parse (so that its usage
// error is written in that format): looked for before "--" or "-c" only.
LogFormat requested_log_format(int argc, char** argv);

// The default operation name for a command: its base name, or the script's
// base name when the command is an interpreter followed by a script. Never an
// absolute path and never any other argument.
std::string derive_operation(const std::vector<std::string>& command);

// The kill-after of the etcd lease's deadlines for --ttl `ttl_s`: the given
// --kill-after (`given_text` as typed, for the message), or by default a
// sixth of the TTL, at most 5 s. Throws Fatal 64 for 0 (a lease holder must
// be killable before its lease expires) and for a value that leaves no room
// to renew the lease inside the TTL (settings/lease_timing.hpp).
Duration lease_kill_after(std::optional<Duration> given, int ttl_s, std::string_view given_text = {});

const std::string& help_text();

}  // namespace looplock
