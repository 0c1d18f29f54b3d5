// Handing a run with --etcd to looplock-etcd. The looplock executable is
// linked statically and has no HTTP client (see etcd_curl.hpp for why); a run
// that needs the cluster lock (or --inspect --etcd) execs looplock-etcd, the
// same program linked with libcurl, with the same arguments and environment,
// the same pid (so nesting and the holder record are unchanged), and the start
// time in LOOPLOCK_START_NS so that the deadline still counts from when
// looplock started. looplock-etcd removes that variable before anything else
// sees the environment.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/environment.hpp"
#include "os/clock.hpp"

namespace looplock {

inline constexpr std::string_view kClusterHelperName = "looplock-etcd";

// Where looplock-etcd is looked for, in order: beside the running executable
// (`self_exe`, the build tree or one directory for both), then `libexec_dir`
// (where meson installs it). Duplicates are dropped.
std::vector<std::string> cluster_helper_paths(std::string_view self_exe, std::string_view libexec_dir);

// What --version says about --etcd in looplock: the path of the
// looplock-etcd that exec_cluster_helper would run (the first of
// cluster_helper_paths that exists), or that none is installed, where it was
// looked for and what to install.
std::string cluster_helper_status();

// Execs looplock-etcd, trying each of cluster_helper_paths; returns only by
// throwing Fatal 69 (none exists) or 71 (one exists but cannot be executed).
// Once exec'd, a helper that cannot start (its libcurl missing) ends with the
// dynamic loader's status, 127.
// `start`: when looplock started, handed over as nanoseconds of the
// monotonic clock (LOOPLOCK_START_NS).
[[noreturn]] void exec_cluster_helper(char** argv, const EnvList& env, Instant start);

// The start time handed over in `env` when it is believable (not in the
// future, less than a minute ago on CLOCK_MONOTONIC); `env` loses the
// variable either way.
std::optional<Instant> take_handed_start(EnvList& env, Instant now);

}  // namespace looplock
