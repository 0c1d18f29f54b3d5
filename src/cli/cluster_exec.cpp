#include "cli/cluster_exec.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "base/error.hpp"
#include "base/exit_codes.hpp"
#include "base/text.hpp"
#include "os/sys.hpp"

#ifndef LOOPLOCK_HELPER_DIR
#define LOOPLOCK_HELPER_DIR "/usr/local/libexec/looplock"
#endif

namespace looplock {

namespace {
constexpr Duration kMaxHandOver = std::chrono::seconds(60);
constexpr std::string_view kInstallHint = "install the looplock-etcd package";

// Where this executable looks for looplock-etcd.
std::vector<std::string> installed_helper_paths() {
  // Unknown (no /proc): only the install's directory is tried.
  return cluster_helper_paths(sys::own_executable().value_or(""), LOOPLOCK_HELPER_DIR);
}

}  // namespace

std::vector<std::string> cluster_helper_paths(std::string_view self_exe, std::string_view libexec_dir) {
  std::vector<std::string> out;
  if (auto slash = self_exe.rfind('/'); slash != std::string_view::npos && self_exe.starts_with('/')) {
    out.push_back(std::string(self_exe.substr(0, slash + 1)) + std::string(kClusterHelperName));
  }
  if (!libexec_dir.empty()) {
    std::string p =
        std::string(libexec_dir) + (libexec_dir.ends_with('/') ? "" : "/") + std::string(kClusterHelperName);
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(std::move(p));
  }
  return out;
}

std::string cluster_helper_status() {
  if (!sys::abilities().cluster) return "not available on this system (no etcd transport here: looplock-windows(7))";
  const auto paths = installed_helper_paths();
  for (const auto& path : paths) {
    const int err = sys::execute_access(path);
    if (err == ENOENT) continue;
    if (err != 0) return "not available: " + path + " cannot be executed (" + std::string(std::strerror(err)) + ")";
    return "available, through " + path;
  }
  return "not available: " + std::string(kClusterHelperName) + " is not installed (looked for " + join(paths) + "); " +
         std::string(kInstallHint);
}

void exec_cluster_helper(char** argv, const EnvList& env, Instant start) {
  const EnvList handed = env_with(env, {{env_name::kStartNs, std::to_string(ns_of(start))}});

  const auto paths = installed_helper_paths();
  std::string failed;  // the first that exists but cannot be executed
  int failed_errno = 0;
  for (const auto& path : paths) {
    const int err = sys::exec_program(path, argv, handed);
    if (err != ENOENT && failed.empty()) {
      failed = path;
      failed_errno = err;
    }
  }
  if (!failed.empty()) {
    fail_errno(exit_code::kOsError, "cannot run " + failed + " for --etcd", failed_errno,
               "Check that looplock-etcd is installed whole (the file and its mode).");
  }
  throw Fatal(exit_code::kClusterUnavailable,
              "cluster locking (--etcd or $LOOPLOCK_ETCD) needs " + std::string(kClusterHelperName) +
                  ", which is not installed (looked for " + join(paths) + ")",
              "Install the looplock-etcd package (apt-get install looplock-etcd), or from source build with "
              "libcurl (meson setup -Detcd=enabled) and install it; or run without --etcd and without "
              "$LOOPLOCK_ETCD. The command did not run.",
              "etcd_helper_missing");
}

std::optional<Instant> take_handed_start(EnvList& env, Instant now) {
  auto text = env_get(env, env_name::kStartNs);
  if (!text) return std::nullopt;
  env = env_with(env, {}, {env_name::kStartNs});
  long long v = 0;  // nanoseconds on the monotonic clock, as the environment carries them
  auto [p, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc() || p != text->data() + text->size() || v <= 0) return std::nullopt;
  const Instant start = instant_ns(v);
  if (start > now || now - start > kMaxHandOver) return std::nullopt;
  return start;
}

}  // namespace looplock
