// The variables looplock exports to the command, and reading a copied
// environment (looplock keeps no global state: main() passes envp down).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace looplock {

namespace env_name {
inline constexpr std::string_view kFd = "LOOPLOCK_FD";
inline constexpr std::string_view kDir = "LOOPLOCK_DIR";
inline constexpr std::string_view kLockId = "LOOPLOCK_LOCK_ID";
inline constexpr std::string_view kPolicy = "LOOPLOCK_POLICY";
// For nesting: the looplock process that holds the lock, and its fd number.
inline constexpr std::string_view kHolderPid = "LOOPLOCK_HOLDER_PID";
inline constexpr std::string_view kHolderFd = "LOOPLOCK_HOLDER_FD";
// --holders N: which of the N holders the command runs under (0 to N-1).
inline constexpr std::string_view kHolderIndex = "LOOPLOCK_HOLDER_INDEX";
inline constexpr std::string_view kAgent = "LOOPLOCK_AGENT";
// --notify's notifier: the event it is run for.
inline constexpr std::string_view kEvent = "LOOPLOCK_EVENT";
inline constexpr std::string_view kMetricsDir = "LOOPLOCK_METRICS_DIR";
// When looplock sends the command TERM for --max-time (Unix time, seconds
// with milliseconds); nested, the earlier of its own and the inherited one.
inline constexpr std::string_view kDeadline = "LOOPLOCK_DEADLINE";
// Beside it: "PID:START", the looplock that set it (its pid and start time,
// /proc/PID/stat's field 22). An inner looplock keeps an inherited deadline
// only while that looplock is a live ancestor (nesting.hpp).
inline constexpr std::string_view kDeadlineOwner = "LOOPLOCK_DEADLINE_OWNER";
// The cluster lock (--etcd): the default endpoints, and what the command gets.
// A hold across steps (--hold prints it; --release and nested runs read it).
inline constexpr std::string_view kHold = "LOOPLOCK_HOLD";
inline constexpr std::string_view kEtcd = "LOOPLOCK_ETCD";
inline constexpr std::string_view kEtcdKey = "LOOPLOCK_ETCD_KEY";
inline constexpr std::string_view kEtcdLease = "LOOPLOCK_ETCD_LEASE";
inline constexpr std::string_view kFencingToken = "LOOPLOCK_FENCING_TOKEN";
// Its TLS files and password (read; the password never reaches the command).
inline constexpr std::string_view kEtcdCacert = "LOOPLOCK_ETCD_CACERT";
inline constexpr std::string_view kEtcdClientCert = "LOOPLOCK_ETCD_CLIENT_CERT";
inline constexpr std::string_view kEtcdClientKey = "LOOPLOCK_ETCD_CLIENT_KEY";
inline constexpr std::string_view kEtcdPassword = "LOOPLOCK_ETCD_PASSWORD";
// looplock's start time (CLOCK_MONOTONIC ns), from looplock to looplock-etcd
// only (cluster_exec.hpp); never passed on.
inline constexpr std::string_view kStartNs = "LOOPLOCK_START_NS";
}  // namespace env_name

using EnvList = std::vector<std::string>;  // "NAME=value" entries

EnvList env_from(char** envp);
std::optional<std::string> env_get(const EnvList& env, std::string_view name);
// Each of `set` replaces any entry of the same name (in order, at the end),
// and every name in `unset` is removed: in place (the command's
// environment, built once per run), or in a copy.
void env_set(EnvList& env, const std::vector<std::pair<std::string_view, std::string>>& set,
             const std::vector<std::string_view>& unset = {});
EnvList env_with(const EnvList& env, const std::vector<std::pair<std::string_view, std::string>>& set,
                 const std::vector<std::string_view>& unset = {});

// LOOPLOCK_DEADLINE's value for `ms` since the epoch: "1764601200.123".
std::string format_deadline(long long ms);
// Its value read back (ms since the epoch); nullopt when absent or not that
// form.
std::optional<long long> parse_deadline(const std::optional<std::string>& value);

// LOOPLOCK_DEADLINE_OWNER's value, and read back (nullopt when absent or not
// "PID:START" with a pid above 0 and a start of digits).
struct DeadlineOwner {
  long long pid = 0;
  std::string start;
};
std::string format_deadline_owner(long long pid, const std::string& start);
std::optional<DeadlineOwner> parse_deadline_owner(const std::optional<std::string>& value);

}  // namespace looplock
